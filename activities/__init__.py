"""The control plane's I/O: the state store and reservation ledger (``store/``), the activities
the workflows call (``control.py``), and the payloads that cross Temporal (``payloads.py``)."""
