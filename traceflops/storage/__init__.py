"""What is kept on disk: bundles of tables, the parsed-trace cache, the report cache, per-rank summaries.

Imports `core` only: storage never decides what a number is.
"""
