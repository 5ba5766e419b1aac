"""The decisive reason comes first: the stage that removed the last remaining workers."""

import pytest

from scheduler.decide import decide
from scheduler.decision import FilterVerdict
from scheduler.estimate import estimate_request
from scheduler.reasons import NO_FIT, rank
from scheduler.spec import ModelSpec
from tests.conftest import cluster, gpu, worker

# Four workers a..d go through the chain; each row says which filter removed whom.
CLUSTER_NOTE = FilterVerdict("cluster", 4, ["a", "b", "c", "d"], {}, "Matched 4 workers by cluster selector.")
LABELS_ONE = FilterVerdict("labels", 4, ["b", "c", "d"], {"a": ["label gpu wanted, worker has none"]},
                           "Matched 3/4 workers by label selector: {'gpu': 'yes'}.")
STATUS_ALL = FilterVerdict("status", 3, [], {"b": ["worker state is not_ready, not ready"],
                                             "c": ["worker state is not_ready, not ready"],
                                             "d": ["worker state is not_ready, not ready"]},
                           "Matched 0/3 workers by READY status.")
STATUS_ONE = FilterVerdict("status", 3, ["c", "d"], {"b": ["worker state is not_ready, not ready"]},
                           "Matched 2/3 workers by READY status.")
BACKEND_ALL_NO_NOTE = FilterVerdict("backend", 2, [], {"c": ["worker has no GPU and vllm does not run on CPU"],
                                                       "d": ["worker has no GPU and vllm does not run on CPU"]})
SELECTOR = ["The model needs 1.01 GiB of VRAM.", "No GPU to offload layers to (c: no GPU), and a CPU-only run "
            "is not allowed: cpu_offloading is off."]


@pytest.mark.parametrize("verdicts, msgs, scheduled, first, decisive", [
    # status removed the last 3 workers (b, c, d): its note and its 3 lines lead (1 + 3 = 4 decisive);
    # the labels filter, which removed only a, follows; the cluster note (removed nobody) is last
    ([CLUSTER_NOTE, LABELS_ONE, STATUS_ALL], None, False,
     ["Matched 0/3 workers by READY status.", "status: worker b: worker state is not_ready, not ready"], 4),
    # a filter without a note still leads with its per-worker lines (2 workers, 2 decisive)
    ([CLUSTER_NOTE, BACKEND_ALL_NO_NOTE], None, False,
     ["backend: worker c: worker has no GPU and vllm does not run on CPU"], 2),
    # c and d passed every filter; the selectors found no fit: their 2 messages lead, before the
    # label selector that removed a (the defect: that line used to come first)
    ([CLUSTER_NOTE, LABELS_ONE, STATUS_ONE], SELECTOR, False, SELECTOR, 2),
    # the selectors ran and said nothing: a generic line still leads (1 decisive)
    ([CLUSTER_NOTE, LABELS_ONE], [], False, [NO_FIT, "Matched 3/4 workers by label selector: {'gpu': 'yes'}."], 1),
    # placed: nothing is decisive; removals first, idle notes last
    ([CLUSTER_NOTE, LABELS_ONE], None, True,
     ["Matched 3/4 workers by label selector: {'gpu': 'yes'}.", "labels: worker a: label gpu wanted, worker has none",
      "Matched 4 workers by cluster selector."], 0),
])
def test_rank_puts_the_deciding_stage_first(verdicts, msgs, scheduled, first, decisive):
    reasons, n = rank(verdicts, msgs, scheduled)
    assert reasons[:len(first)] == first
    assert n == decisive
    # nothing is lost: every note, every per-worker line and every message is still there
    every = [v.note for v in verdicts if v.note] + [f"{v.name}: worker {w}: {r}" for v in verdicts
                                                     for w, rs in v.removed.items() for r in rs]
    assert sorted(set(reasons) - {NO_FIT} - set(msgs or [])) == sorted(every)


def test_a_gguf_model_on_a_gpu_less_worker_names_the_cpu_rule_not_the_labels(smollm2):
    """The first hour's case: the label selector removed the simulated-GPU worker and kept the
    CPU-only one, where the GGUF model could not run with cpu_offloading off. The decisive
    reasons are the selector's: what the model needs, and that the CPU run is off."""
    snap = cluster([worker("dev", 64, [gpu(0, 24)]), worker("cpu1", 16, labels={"role": "cpu"})])
    spec = ModelSpec.model_validate({"name": "smol", "source": {"local_path": smollm2}, "backend": "llama.cpp",
                                     "worker_selector": {"role": "cpu"}, "cpu_offloading": False})
    d = decide(snap, spec, estimate_request(spec))
    assert not d.scheduled and d.decisive == 2
    head = d.reasons[:d.decisive]
    assert head[0].startswith("The model needs ")
    assert head[1] == ("No GPU to offload layers to (cpu1: no GPU), and a CPU-only run is not allowed: "
                       "cpu_offloading is off.")
    assert not any("label" in r for r in head)
    assert d.reasons[2:4] == ["Matched 1/2 workers by label selector: {'role': 'cpu'}.",
                              "labels: worker dev: label role wanted, worker has none"]


def test_a_custom_server_on_a_gpu_less_worker_says_the_cpu_is_off():
    """Custom backends run anywhere; with no GPU left the CPU is the only way, and it is off."""
    from scheduler.request import FlatRequest
    from scheduler.units import GiB

    snap = cluster([worker("cpu1", 16)])
    spec = ModelSpec.model_validate({"name": "c", "source": {"local_path": "/m"}, "backend": "custom",
                                     "run_command": "serve", "resources": {"vram": "1 GiB", "ram": "1 GiB"}})
    d = decide(snap, spec, FlatRequest(vram=GiB, ram=GiB))
    assert not d.scheduled
    assert d.reasons[:d.decisive][-1] == "cpu: Workers without a GPU (cpu1) could run it on the CPU, but cpu_offloading is off."
