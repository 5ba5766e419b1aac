"""Tenants as pure policy: the tenants file (config.py), what each tenant uses (usage.py),
admission against limits and guarantees (admission.py), preemption with a minimal victim set
(preemption.py) and the ordered queue of PENDING replicas (queue.py). Kueue is the anchor."""
