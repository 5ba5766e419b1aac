"""The host agent: inventory (NVML or a simulated file), and the activities on the host's own task
queue that launch, supervise and stop instance processes."""
