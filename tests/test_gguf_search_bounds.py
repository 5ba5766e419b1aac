"""The pruning in the GGUF searches is safe: the one-GPU figure (``GGUFRequest.vram_floor``) never
exceeds what the GPUs of any tensor split need together, so a combination whose allocatable
total is below it provably cannot hold that many layers (gguf_rpc.py, gguf_partial.py)."""

import pytest
from hypothesis import given, settings, strategies as st

from scheduler.estimate import gguf_request
from scheduler.gguf.layers import layers_per_device
from scheduler.units import GiB


@pytest.fixture(scope="module", params=["smollm2", "llama3_gguf"])
def req(request):
    return gguf_request(request.getfixturevalue(request.param), [])


@settings(max_examples=200, deadline=None)
@given(split=st.lists(st.integers(1, 80 * 1024), min_size=1, max_size=6), rpc=st.integers(0, 5),
       layers=st.integers(0, 40), data=st.data())
def test_floor_holds_for_every_split(req, split, rpc, layers, data):
    # split in MiB: the first `rpc` devices are RPC servers, the rest the main worker's GPUs (the
    # searches always keep one); `layers` offloaded (>= total: everything). Each RPC server and the
    # main worker are discrete (NonUMA) or unified (UMA); each GPU is checked with its kind's figure.
    rpc = min(rpc, len(split) - 1)
    n = min(layers, req.total_layers)
    main_uma = data.draw(st.booleans())
    rpc_uma = data.draw(st.lists(st.booleans(), min_size=rpc, max_size=rpc))
    item = req.run(tuple(v * 2**20 for v in split), tuple(f"h:{i}" for i in range(rpc)),
                   gpu_layers=-1 if n == req.total_layers else n)
    kinds = rpc_uma + [main_uma] * (len(split) - rpc)
    need = sum(v.uma if u else v.nonuma for v, u in zip(item.vrams, kinds))
    floor = req.vram_floor(n, main_uma, remote_nonuma=rpc_uma.count(False), more_local=len(split) - rpc - 1)
    assert floor <= need


def test_floor_grows_with_layers(req):
    floors = [req.vram_floor(n, uma=False) for n in range(req.total_layers + 1)]
    assert floors == sorted(floors) and floors[-1] == req.full.vrams[0].nonuma  # one GPU
    assert floors[-1] / GiB > 0.5


@settings(max_examples=100, deadline=None)
@given(split=st.lists(st.integers(1, 80 * 1024), min_size=1, max_size=6), rpc=st.integers(0, 5), layers=st.integers(0, 40))
def test_ram_does_not_depend_on_the_split(req, split, rpc, layers):
    # the CPU's share (layers left on it, footprint, its buffers) is fixed by the offload count,
    # so a main worker short of RAM at n layers is short for every combination: checked once
    rpc = min(rpc, len(split) - 1)
    n = min(layers, req.total_layers)
    item = req.run(tuple(v * 2**20 for v in split), tuple(f"h:{i}" for i in range(rpc)),
                   gpu_layers=-1 if n == req.total_layers else n)
    one = req.full if n == req.total_layers else req.items[n]
    assert (item.ram.uma, item.ram.nonuma) == (one.ram.uma, one.ram.nonuma)


@settings(max_examples=300, deadline=None)
@given(split=st.lists(st.integers(0, 80 * 1024), min_size=1, max_size=9).filter(lambda s: sum(s) > 0),
       rpc=st.integers(0, 8), layers=st.integers(-1, 40))
def test_layers_per_device_matches_the_estimate(req, split, rpc, layers):
    # the O(devices) count the RPC search prunes with must be the estimator's own placement
    rpc = min(rpc, len(split) - 1)
    item = req.run(tuple(split), tuple(f"h:{i}" for i in range(rpc)), gpu_layers=layers)
    counts = layers_per_device(req.model.n_layer, tuple(float(v) for v in split), layers)
    assert counts == [v.handle_layers for v in item.vrams]


@settings(max_examples=200, deadline=None)
@given(split=st.lists(st.integers(1, 40 * 1024), min_size=2, max_size=9), rpc=st.integers(1, 8),
       layers=st.integers(1, 40), data=st.data())
def test_rpc_server_floor_holds(req, split, rpc, layers, data):
    # each GPU of an RPC split (discrete or unified memory) that takes layers needs at least the
    # buffers (discrete only) plus the least a layer costs times its layers: the search skips an
    # estimate below that
    rpc = min(rpc, len(split) - 1)
    n = min(layers, req.total_layers)
    uma = data.draw(st.lists(st.booleans(), min_size=rpc, max_size=rpc))
    allocs = tuple(v * 2**20 for v in split)
    item = req.run(allocs, ("h",) * rpc, gpu_layers=-1 if n == req.total_layers else n)
    counts = req.layer_counts(allocs, -1 if n == req.total_layers else n)
    buffers, per_layer = req.rpc_server_floor(n)
    main_uma = data.draw(st.booleans())
    kinds = uma + [main_uma] * (len(split) - rpc)
    for v, u, c in zip(item.vrams, kinds, counts):  # RPC servers, then the main worker's GPUs
        assert (0 if u or not c else buffers) + c * per_layer <= (v.uma if u else v.nonuma)
