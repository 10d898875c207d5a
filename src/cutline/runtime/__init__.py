"""The streaming runtime: tasks, channels, state, checkpoint storage, recovery.

Built so far: :mod:`cutline.runtime.checkpoint.storage` (checkpoint storage on any fsspec URL).
The rest of the runtime (issue 3) drives the same :mod:`cutline.protocol` objects.
"""
