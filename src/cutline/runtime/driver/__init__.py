"""What runs on the driver: the job driver and its attempts, the checkpoint coordinator's host, the
job's result, metrics and the savepoint client.
"""
