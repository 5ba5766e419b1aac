"""Metric-driven autoscaling, as pure policy: the spec's ``autoscaling`` block (config.py),
windowed values from Prometheus histograms (histogram.py), one sample of signals per interval
(signals.py), each rule's vote (rules.py) and the decision with its anti-flap state (policy.py).
No I/O and no clock: samples and ``now`` come in, a decision and the next state go out."""
