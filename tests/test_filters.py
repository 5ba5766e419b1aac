"""Each filter removes exactly the workers it should, and says why with the numbers."""

import pytest

from scheduler.cluster import ModelFile
from scheduler.decide import decide
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker

REQ = FlatRequest(vram=GiB, ram=GiB)


def spec(**kw):
    base = dict(name="m", source={"huggingface": {"repo": "o/m"}}, backend="custom", run_command="x")
    base.update(kw)
    return ModelSpec(**base)


def removed(d, name):
    return next(v.removed for v in d.filters if v.name == name)


def test_chain_order_and_early_stop():
    snap = cluster([worker("a", 8, [gpu(0, 8)], cluster="other")])
    d = decide(snap, spec(), REQ)
    assert [v.name for v in d.filters] == ["cluster"]  # stops at the first empty result
    assert removed(d, "cluster") == {"a": ["worker is in cluster 'other', the model asks for 'default'"]}
    assert d.reasons[0] == "Matched 0 workers by cluster selector."


def test_gpu_selector_names_missing_workers_and_gpus():
    snap = cluster([worker("a", 8, [gpu(0, 8)]), worker("b", 8, [gpu(0, 8)])])
    d = decide(snap, spec(gpu_selector={"gpu_ids": ["a:cuda:3", "ghost:cuda:0"]}), REQ)
    assert removed(d, "gpu_selector")["a"] == ["selected GPU a:cuda:3 does not exist (worker has indexes [0])"]
    assert "b" in removed(d, "gpu_selector")
    assert "Missing workers: ghost." in d.filters[1].note


def test_labels_status_backend():
    snap = cluster([worker("lin", 8, [gpu(0, 8)], labels={"os": "linux"}), worker("mac", 8, [gpu(0, 8, "metal", "apple")], labels={"os": "darwin"}),
                    worker("down", 8, [gpu(0, 8)], labels={"os": "linux"}, state="maintenance"),
                    worker("amd", 8, [gpu(0, 8, "rocm", "amd")], labels={"os": "linux"}, backends=["llama.cpp"])])
    d = decide(snap, spec(backend="vllm", run_command=None, worker_selector={"os": "linux"}), REQ)
    assert removed(d, "labels") == {"mac": ["label os='linux' wanted, worker has 'darwin'"]}
    assert removed(d, "status") == {"down": ["worker state is maintenance, not ready"]}
    assert removed(d, "backend") == {"amd": ["cannot run vllm: no vllm executable found (it runs: llama.cpp)"]}
    cpu_only = cluster([worker("c", 64)])
    d = decide(cpu_only, spec(backend="vllm", run_command=None), REQ)
    assert removed(d, "backend") == {"c": ["worker has no GPU and vllm does not run on CPU"]}


# Workers a (READY row), b (row in error), c (no row). GPUStack runs the filter only when
# gpu_ids is set; a missing row proves nothing, so only b can ever be removed.
@pytest.mark.parametrize("gpu_ids,removed_workers,placed", [
    ([], {}, "a"),  # no GPU pinned: the filter does not run; spread ties go to the first worker
    (["b:cuda:0"], {"b": ["model path '/models/m' is in error on this worker"]}, None),  # only b selected, and b is out
    (["c:cuda:0"], {}, "c"),  # c has no row: kept (GPUStack would ask c; a missing row is no answer)
    (["a:cuda:0"], {}, "a"),
])
def test_local_path_filter_runs_only_with_gpu_ids(gpu_ids, removed_workers, placed):
    snap = cluster([worker("a", 8, [gpu(0, 8)]), worker("b", 8, [gpu(0, 8)]), worker("c", 8, [gpu(0, 8)])],
                   model_files=[ModelFile(worker="a", source="/models/m"), ModelFile(worker="b", source="/models/m", state="error")])
    d = decide(snap, spec(source={"local_path": "/models/m"}, gpu_selector={"gpu_ids": gpu_ids}), REQ)
    assert removed(d, "local_path") == removed_workers
    assert (d.placement.worker if d.scheduled else None) == placed


def test_local_path_filter_note_names_the_workers():
    snap = cluster([worker(n, 8, [gpu(0, 8)]) for n in "abcde"],
                   model_files=[ModelFile(worker=n, source="/m", state="error") for n in "bcde"])
    d = decide(snap, spec(source={"local_path": "/m"}, gpu_selector={"gpu_ids": ["a:cuda:0", "b:cuda:0"]}), REQ)
    assert set(removed(d, "local_path")) == {"b"}  # c, d, e already left at the GPU selector
    d = decide(snap, spec(source={"local_path": "/m"}, gpu_selector={"gpu_ids": [f"{n}:cuda:0" for n in "abcde"]}), REQ)
    note = next(v.note for v in d.filters if v.name == "local_path")
    assert note == "The model file path '/m' does not exist on the following workers: b, c, d... (+1 more)."


def test_local_path_filter_leaves_out_hosts_whose_agent_did_not_find_the_path():
    # a host read (activities/host_estimate.py) recorded a: ready, b: missing; c was not asked
    snap = cluster([worker("a", 8, [gpu(0, 8)]), worker("b", 8, [gpu(0, 8)]), worker("c", 8, [gpu(0, 8)])],
                   model_files=[ModelFile(worker="a", source="/models/m"), ModelFile(worker="b", source="/models/m", state="missing")])
    d = decide(snap, spec(source={"local_path": "/models/m"}), REQ)
    # c has no row: not asked yet (it joined later, say), so it stays and the next read asks it
    assert removed(d, "local_path") == {"b": ["model path '/models/m' is not on this worker (its agent looked)"]}
    assert d.placement.worker == "a"
