"""Networking between the driver and the slots and between subtasks: sockets (``net``), the data
wire format (``wire``), the credit-based data channels (``channel``, ``frames``) and the
driver's control channel (``control``).
"""
