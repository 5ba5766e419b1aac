"""The model spec's ``topology_policy``, with Kubernetes Topology Manager's meaning over the NUMA
nodes of a replica's GPUs, and the CPU set a pinned engine is bound to.

- ``none`` (default): no check.
- ``best-effort``: any placement is admitted; the topology scorer still prefers the best joined
  set (as the kubelet admits a pod whose preferred affinity is not met), and a placement across
  NUMA nodes is noted in the reasons.
- ``restricted``: a GPU set is refused when it spans more NUMA nodes than the fewest its worker
  could give that many GPUs from. As the kubelet's preferred hint, this counts all of the
  worker's GPUs, free or not: 2 GPUs on a box of 4 per node must share a node; 6 may use 2.
- ``single-numa-node``: a GPU set is refused unless all its GPUs are on one NUMA node.
A GPU whose NUMA node is unknown gives no hint, so its worker's set is admitted (Topology
Manager does the same for a resource without a hint provider). Each worker's part of a
placement across workers is checked on its own. A CPU-only or one-GPU placement always passes.
Refusals name the policy and the nodes: ``single-numa-node: GPUs 3 and 4 are on NUMA nodes 0 and 1``.
"""

from __future__ import annotations

from scheduler import interconnect
from scheduler.cluster import ClusterSnapshot, Worker
from scheduler.spec import ModelSpec, TopologyPolicy

SHOWN = 5  # refusals listed one by one; the rest are counted


def _and(xs) -> str:
    xs = [str(x) for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def fewest_nodes(w: Worker, n: int) -> int | None:
    """The fewest NUMA nodes that hold n of the worker's GPUs (None: some GPU's node is unknown)."""
    nodes = [g.numa_node for g in w.gpus]
    if any(x is None for x in nodes):
        return None
    sizes = sorted((nodes.count(x) for x in set(nodes)), reverse=True)
    held = 0
    for k, size in enumerate(sizes, 1):
        held += size
        if held >= n:
            return k
    return None


def broken(policy: TopologyPolicy, w: Worker, gpus: list[int]) -> str | None:
    """Why this worker's GPU set breaks ``policy``, or None."""
    if policy in (TopologyPolicy.NONE, TopologyPolicy.BEST_EFFORT) or len(gpus) < 2:
        return None
    nodes = interconnect.numa_nodes(w, gpus)
    if any(x is None for x in nodes) or len(set(nodes)) == 1:
        return None
    what = f"{policy.value}: GPUs {_and(gpus)} are on NUMA nodes {_and(nodes)} (worker {w.name})"
    if policy == TopologyPolicy.SINGLE_NUMA_NODE:
        return what
    least = fewest_nodes(w, len(gpus))
    if least is not None and len(set(nodes)) > least:
        return f"{what}; {least} NUMA node{'s' if least > 1 else ''} could hold {len(gpus)} of its GPUs"
    return None


def check(snapshot: ClusterSnapshot, policy: TopologyPolicy, cand) -> str | None:
    parts = [(cand.worker, cand.gpu_indexes)] + [(s.worker, s.gpu_indexes) for s in cand.subordinates]
    for name, gpus in parts:
        w = snapshot.worker(name)
        why = broken(policy, w, list(gpus)) if w is not None else None
        if why:
            return why
    return None


def keep(snapshot: ClusterSnapshot, policy: TopologyPolicy, cands: list) -> tuple[list, list[str]]:
    """The candidates the policy admits, and why the others were refused (the first few, then a count)."""
    if policy in (TopologyPolicy.NONE, TopologyPolicy.BEST_EFFORT):
        return cands, []
    kept, why = [], []
    for c in cands:
        r = check(snapshot, policy, c)
        if r is None:
            kept.append(c)
        elif r not in why:
            why.append(r)
    if len(why) > SHOWN:
        why = why[:SHOWN] + [f"{policy.value}: {len(why) - SHOWN} more GPU sets refused"]
    return kept, why


def admitted_note(snapshot: ClusterSnapshot, policy: TopologyPolicy, cand) -> list[str]:
    """best-effort: say so when the placement spans NUMA nodes (admitted all the same)."""
    if policy != TopologyPolicy.BEST_EFFORT:
        return []
    why = check(snapshot, TopologyPolicy.SINGLE_NUMA_NODE, cand)
    return [why.replace(TopologyPolicy.SINGLE_NUMA_NODE.value, policy.value, 1) + "; admitted"] if why else []


def wants_pinning(spec: ModelSpec) -> bool:
    return spec.cpu_pinning or spec.topology_policy == TopologyPolicy.SINGLE_NUMA_NODE


def binding(snapshot: ClusterSnapshot, cand) -> tuple[str | None, list[int] | None]:
    """(CPU list, NUMA nodes) local to the candidate's GPUs on its main worker; (None, None) when the
    worker did not report them (the agent then skips pinning with a warning)."""
    w = snapshot.worker(cand.worker)
    if w is None or not cand.gpu_indexes:
        return None, None
    nodes = interconnect.numa_nodes(w, cand.gpu_indexes)
    cpus = interconnect.local_cpus(w, cand.gpu_indexes)
    return cpus, (sorted(set(nodes)) if nodes and None not in nodes else None)
