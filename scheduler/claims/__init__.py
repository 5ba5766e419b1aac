"""Memory claims learned from what replicas use (issue 42): a fingerprint per (model, engine,
memory-changing parameters, GPU model), a VPA-style decaying histogram of the measured peaks per
fingerprint, and the recommender over it. Pure: no I/O, ``now`` is passed in."""
