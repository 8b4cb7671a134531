"""Plain values every layer may use: errors and exit codes, the `Trace` model, result types, vocabularies, formatting,
files, the hardware table.

Imports nothing else of traceflops.
"""
