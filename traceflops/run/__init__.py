"""Side effects around the pipeline: naming input files, loading a trace (cache or parse), analysing a path, running
ranks in a pool or on Ray."""
