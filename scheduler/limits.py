"""How big anything may be, everywhere: absolute ceilings the spec's validation and every bounded
field hold to (scheduler/bounds.py), whatever the operator's settings say. The operator's own
maximum (``GPUFLOW_LIMITS__MAX_REPLICAS``) is contracts/limits.py ``Limits``. A number past these
is refused with the field named, before it reaches a workflow's history (where 100,000 replicas
once failed every workflow task with PayloadsTooLarge, forever)."""

from __future__ import annotations

REPLICAS_CEILING = 4096  # no operator setting goes above this
MAX_BYTES = 2**50  # 1 PiB: more memory than any one machine (or replica) has
MAX_GPUS = 1024  # GPUs per replica, GPU ids in a selector
MAX_WAIT_S = 30 * 86400.0  # any duration in Timings: 30 days
