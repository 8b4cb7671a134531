"""The command line: click commands that wire the run layer to the renderers."""
