"""Deterministic Temporal workflows (instance lifecycle, deployment reconciliation, host
liveness). Built by the control-plane issue."""
