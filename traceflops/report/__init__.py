"""Renderers of a finished `Analysis`, `Job` or diff: terminal, JSON, HTML, tables, the annotated trace. A renderer computes nothing new.
"""
