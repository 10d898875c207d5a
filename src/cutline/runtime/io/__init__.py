"""The built-in sources and sinks: what a job reads and where it writes, exactly once."""
