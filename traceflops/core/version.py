"""The tool's version: in reports, and in every cache key (a new version never reads an old entry)."""

VERSION = "0.3.1"
