"""Keyed state: key groups, segments, the backend interface and its memory and RocksDB backends,
and the state primitives operators use (value, list and map state).
"""
