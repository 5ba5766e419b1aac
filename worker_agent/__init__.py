"""The host agent: inventory (NVML or a simulated file), and the activities on the host's own task
queue that launch, supervise and stop instance processes, with their inputs and results in
``contracts/agent.py``. Imports ``scheduler``, ``hubio`` and ``contracts``: never the control
plane (``activities/``, ``workflows/``, ``store/``)."""
