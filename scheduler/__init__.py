"""gpuflow's scheduling policy: pure functions from (cluster snapshot, model spec, resource
request) to a placement decision with its full explanation. Nothing here touches a database,
the network, NVML, the clock or randomness; reading model-file headers is the one I/O step,
done once per model by :mod:`scheduler.estimate`. Imports nothing of ours: every other package
imports it."""
