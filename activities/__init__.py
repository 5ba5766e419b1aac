"""The control plane's I/O (task queue ``gpuflow-control``): the activities the workflows call,
grouped by concern, each class built with only what it uses:

- ``placement.py``: estimate, decide, place (batched: ``place_batch.py``), reserve, preempt,
  release, scale-down ranking; the decisions are ``decider.py``'s (one at a time, on the
  snapshot cache), with tenancy (``tenancy.py``);
- ``records.py``: deployment and instance rows (group commit: ``record_batch.py``), new replicas'
  workflows, instances whose workflows ended;
- ``hosts.py``: a host's report, loss and removal, the model paths the hosts read
  (``host_estimate.py``); ``booking.py``: the booking check; ``drain.py``: draining a replica;
- ``queue.py``: limits, tenants, the PENDING queue's sweep (the wake: ``wake_queue.py``);
- ``autoscale.py``: the autoscaler's step; ``rollout_probe.py``: the rollout's look at replicas.

Every writer first checks that its caller is the workflow its input names (``callers.py``: one
table, one function; the reads it leaves open are listed there with why).

``worker_set.py`` builds them all for one worker, with the shared pieces (``runner.py``'s pool,
``estimate_cache.py``, the snapshot cache, the Decider, the Waker). It may import ``scheduler``,
``hubio``, ``contracts`` and ``store``; never ``workflows``, nor ``worker_agent``."""
