"""Bad GGUF files give ModelFileError naming the problem, never a crash or a huge allocation."""

import os
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gpuflow.demo.synthetic import write_llama_gguf
from scheduler.errors import ModelFileError
from scheduler.gguf.model import load_model
from scheduler.gguf.reader import read_header


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    p = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_llama_gguf(str(p), n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=32, ctx=256, recipe="F16")
    return p.read_bytes()


def _write(tmp_path, data: bytes, name="m.gguf") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)



@pytest.mark.parametrize("mutate, message", [
    (lambda d: b"GGML" + d[4:], "not a GGUF file: magic b'GGML'"),
    (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], "unsupported GGUF version 1"),
    (lambda d: d[:8] + struct.pack("<Q", 2**60) + d[16:], "tensor count is 1152921504606846976"),
    (lambda d: d[:16] + struct.pack("<Q", 2**40) + d[24:], "metadata count is 1099511627776"),
    (lambda d: d[:24] + struct.pack("<Q", 2**50) + d[32:], "truncated: key of metadata entry 0 needs"),
    (lambda d: d[:100], "tensor count is 21, more than the 84 remaining bytes can hold"),
    (lambda d: d[:2000], "truncated"),
    (lambda d: d[:20], "too small to be a GGUF file (20 bytes)"),
    (lambda d: b"", "too small to be a GGUF file (0 bytes)"),
])
def test_corrupt_headers_are_named(tmp_path, tiny, mutate, message):
    with pytest.raises(ModelFileError) as e:
        read_header(_write(tmp_path, mutate(tiny)))
    assert message in str(e.value)


def test_truncated_tensor_data_is_caught(tmp_path, tiny):
    # header intact, tensor data cut short: the last tensor ends past the end of the file
    with pytest.raises(ModelFileError, match=r"truncated: tensor 'output.weight' ends at byte \d+ but the file has"):
        read_header(_write(tmp_path, tiny[: len(tiny) - 64]))


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="cannot open"):
        read_header(str(tmp_path / "nope.gguf"))


def test_not_a_model(tmp_path):
    from gguf import GGUFWriter
    import numpy as np

    p = str(tmp_path / "proj.gguf")
    w = GGUFWriter(p, "clip")
    w.add_type("projector")
    w.add_tensor("v.x", np.zeros(4, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ModelFileError, match="general.type is 'projector'"):
        load_model(read_header(p))


def test_absurd_counts_allocate_nothing(tmp_path, tiny):
    p = _write(tmp_path, tiny[:16] + struct.pack("<Q", 2**62) + tiny[24:])
    tracemalloc.start()
    with pytest.raises(ModelFileError):
        read_header(p)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10 * 1024 * 1024


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_header_reader(tmp_path, tiny, data):
    """Random byte edits and truncations: the reader either parses or raises ModelFileError."""
    buf = bytearray(tiny[:4096] if data.draw(st.booleans()) else tiny)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, min(len(buf), 3000) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    path = str(tmp_path / "fuzz.gguf")
    with open(path, "wb") as f:
        f.write(bytes(buf[:cut] if data.draw(st.booleans()) else buf))
    try:
        h = read_header(path)
        try:
            load_model(h)
        except ModelFileError:
            pass
    except ModelFileError:
        pass
    finally:
        os.unlink(path)
