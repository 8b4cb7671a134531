"""Analyses derived from finished numbers: roll-ups, advice, collectives, the job view across ranks, before/after diffs.

Imports `core`, `flops`, `stages` and `metrics`; never a renderer.
"""
