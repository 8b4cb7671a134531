"""Every FLOP formula: PyTorch (aten) ops from recorded shapes, XLA HLO dots, convolutions and fused attention, and a
model's analytical FLOPs (PaLM).

Imports only `core`.
"""
