"""The pipeline's stages over a `Trace`: clean, link, phases, count, steps, timeline, roofline.

Each stage is a pure function of frames and returns frames; imports `core`, `flops` and earlier stages only.
"""
