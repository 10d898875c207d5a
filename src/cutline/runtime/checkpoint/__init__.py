"""Checkpoints on storage: the directory layout and metadata, the subtask state file, statistics,
restore planning, the directory's lock, the reader and the verifier.
"""
