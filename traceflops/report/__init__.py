"""Renderers of one `Analysis`: they format, they compute nothing new."""
