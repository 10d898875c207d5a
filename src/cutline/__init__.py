"""cutline: fault-tolerant stateful stream processing built on consistent distributed snapshots."""

__version__ = "0.1.0"
