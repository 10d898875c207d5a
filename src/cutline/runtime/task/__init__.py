"""What runs on an executor: the slot (one Spark task of the barrier stage), the subtasks it runs,
and how a launcher starts slots.
"""
