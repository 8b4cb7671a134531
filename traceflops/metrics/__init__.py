"""Numbers from the stages' frames: peak and precision, model FLOPs, MFU and HFU per step and in total, the loss budget,
step statistics, conservation checks.

Imports `core`, `flops` and `stages`.
"""
