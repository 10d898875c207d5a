"""Running cutline jobs on Apache Spark: one barrier stage per job attempt."""
