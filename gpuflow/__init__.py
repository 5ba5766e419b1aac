"""gpuflow's entry points: the command line (``cli/``), the local stack (``dev/``), the
processes it runs (``server.py``: the control-plane worker), rendering for people
(``render/``), and the shared core (settings, the Temporal connection, ``ops``). It wires every
other package together, so it may import all of them; none of them imports it but the gateway,
for its Temporal connection."""
