"""GGUF headers that lie about their tensors are refused, naming the key; none spins the
estimator. Files written with gguf.GGUFWriter (gpuflow/demo/synthetic.py), the header then edited."""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time

import pytest

from activities.estimate_process import EstimateCancelled, EstimateTimedOut, alive_children, estimate_in_child
from contracts.placement import EstimateAsk
from gpuflow.demo import synthetic
from scheduler.errors import ModelFileError
from scheduler.estimate import gguf_request
from scheduler.spec import ModelSpec

# 4 layers, 8 heads (2 for k/v), 64 wide, 32 tokens, 256 context
SHAPE = dict(n_layer=4, n_embd=64, n_ff=128, n_head=8, n_head_kv=2, n_vocab=32, ctx=256, recipe="F16")


def lying(tmp_path, **header) -> str:
    return synthetic.write_llama_gguf(str(tmp_path / "m.gguf"), **SHAPE, header=header)


@pytest.mark.parametrize("header, named", [
    ({"llama.block_count": 2**32 - 1}, "llama.block_count is 4294967295: must be 1..1024"),
    ({"llama.block_count": 900}, "llama.block_count is 900 but the file holds 4 layers"),
    ({"llama.block_count": 3}, "llama.block_count is 3 but the file holds 4 layers"),
    ({"llama.block_count": 0}, "llama.block_count is 0"),
    ({"llama.attention.head_count": 0}, "head_count"),
    ({"llama.attention.head_count_kv": 16}, "llama.attention.head_count_kv is 16: must be 1..8"),
    ({"llama.context_length": 0}, "llama.context_length is 0: must be 1..134217728 (missing?)"),
    ({"llama.context_length": None}, "llama.context_length is 0"),
    ({"llama.context_length": 2**40}, "llama.context_length is 1099511627776"),
    ({"llama.vocab_size": 0}, "vocab_size (or the tokenizer.ggml.tokens count) is 0"),
    ({"llama.vocab_size": 31}, "the vocabulary has 31 entries"),
    ({"llama.embedding_length": 128}, "llama.embedding_length is 128 but token_embd.weight is 64 wide"),
    ({"llama.embedding_length": 2**31}, "llama.embedding_length is 2147483648: must be 1..1048576"),
    ({"llama.expert_count": 4, "llama.expert_used_count": 8}, "llama.expert_used_count is 8: must be 0..4"),
])
def test_lying_header_is_refused_naming_the_key(tmp_path, header, named):
    path = lying(tmp_path, **header)
    started = time.monotonic()
    with pytest.raises(ModelFileError) as e:
        gguf_request(path, [])
    assert named in str(e.value)
    assert time.monotonic() - started < 5  # refused at once (the first case used to spin for minutes)


def test_the_honest_file_is_accepted(tmp_path):
    assert gguf_request(lying(tmp_path), []).items[-1].offload_layers == 5  # 4 layers + output


def _spec(path: str) -> ModelSpec:
    return ModelSpec.model_validate({"name": "m", "source": {"local_path": path}, "backend": "llama.cpp"})


def test_estimate_in_a_child_process_is_killed_on_timeout_and_on_cancel(tmp_path, llama3_gguf):
    """The control plane estimates in a child process: past its time, or once cancelled, the
    child is killed, so no thread or process is left spinning."""
    spec = _spec(llama3_gguf)
    assert estimate_in_child(spec, None, 120).items[-1].offload_layers == 33  # Llama-3-8B: 32 layers + output
    with pytest.raises(EstimateTimedOut, match="took longer than 0.001 s and was stopped"):
        estimate_in_child(spec, None, 0.001)
    assert alive_children() == []
    cancel = threading.Event()
    cancel.set()  # the activity was cancelled (the instance stopped) while the child ran
    with pytest.raises(EstimateCancelled):
        estimate_in_child(spec, None, 120, cancel)
    assert alive_children() == []
    with pytest.raises(Exception, match="block_count is 900"):  # a lying header's error crosses the process
        estimate_in_child(_spec(lying(tmp_path, **{"llama.block_count": 900})), None, 120)
    # the most layers a header may claim (1024, all present): 0.3-3 s of estimating, by machine.
    # The timeout is a quarter of what it takes here (at most 0.3 s), so the child is killed
    # while it computes, not before it starts, and long before it would have finished.
    deep = synthetic.write_llama_gguf(str(tmp_path / "deep.gguf"), **{**SHAPE, "n_layer": 1024})
    started = time.monotonic()
    gguf_request(deep, [])
    takes = time.monotonic() - started
    if takes < 0.2:
        pytest.skip(f"estimating 1024 layers takes only {takes:.2f} s here: too fast to tell a kill from an end")
    started = time.monotonic()
    with pytest.raises(EstimateTimedOut):
        estimate_in_child(_spec(deep), None, min(0.3, takes / 4))
    assert time.monotonic() - started < takes and alive_children() == []


async def test_cancelling_the_estimate_activity_kills_its_process(tmp_path):
    """The control plane's estimate activity, cancelled mid-estimate (as when the instance is
    stopped): its child process is killed at once, not left computing."""
    import asyncio

    from temporalio.testing import ActivityEnvironment

    from activities.worker_set import control_activities
    from store import db

    deep = synthetic.write_llama_gguf(str(tmp_path / "deep.gguf"), **{**SHAPE, "n_layer": 1024})
    started = time.monotonic()
    gguf_request(deep, [])
    takes = time.monotonic() - started  # 0.3-3 s, by machine; the child must be killed long before that
    if takes < 0.2:
        pytest.skip(f"estimating 1024 layers takes only {takes:.2f} s here: too fast to tell a kill from an end")
    engine = db.make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    acts = control_activities(engine, client=None)
    env = ActivityEnvironment()
    task = asyncio.ensure_future(env.run(acts.placement.estimate_model, EstimateAsk(spec=_spec(deep).model_dump(mode="json"))))
    for _ in range(500):  # until the child is computing
        children = [c for c in multiprocessing.active_children() if c.name.startswith("gpuflow-estimate")]
        if children:
            break
        await asyncio.sleep(0.01)
    assert children
    env.cancel()
    cancelled = time.monotonic()
    with pytest.raises(BaseException):
        await task
    while alive_children() and time.monotonic() - cancelled < takes / 2:
        await asyncio.sleep(0.02)
    assert alive_children() == [], f"still estimating {takes / 2:.2f} s after the cancel"
    children[0].join(5)
    assert children[0].exitcode == -signal.SIGKILL  # killed, not finished (that would be exit code 0)
    acts.runner.shutdown(wait=True)
