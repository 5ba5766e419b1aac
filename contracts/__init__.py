"""What both sides of the host task queue share (control plane and agent, which may not import
each other): ``contracts/host.py``. Imports only ``scheduler``."""
