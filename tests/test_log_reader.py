"""The agent's log reader: names checked against the log folder, reads from the end start at a line."""

import os

import pytest

from scheduler.errors import InvalidInput
from worker_agent.log_reader import log_file, read_chunk
from contracts.agent import LogRequest


@pytest.mark.parametrize("key, ok", [
    ("m-0", True),
    ("m-0@rpc0", True),  # a helper's log
    ("m-0@ray-head", True),
    ("m.v2_x-1", True),
    ("../m-0", False),  # out of the folder
    ("m-0/../../x", False),
    ("/etc/passwd", False),
    ("m-0@../x", False),  # the part is a name too
    ("m-0@", False),
    ("@rpc0", False),
    ("", False),
    (".hidden", False),  # a name starts with a letter or digit
    ("m\x00", False),
    ("m" * 241, False),  # longer than a file name may be with '.log'
])
def test_names(tmp_path, key, ok):
    if ok:
        assert log_file(str(tmp_path), key) == os.path.join(str(tmp_path), key + ".log")
    else:
        with pytest.raises(InvalidInput, match="not an instance name"):
            log_file(str(tmp_path), key)


def test_a_symlink_out_of_the_folder_is_refused(tmp_path):
    logs, secret = tmp_path / "logs", tmp_path / "secret.log"
    logs.mkdir()
    secret.write_text("not yours\n")
    (logs / "m-0.log").symlink_to(secret)
    with pytest.raises(InvalidInput, match="does not resolve inside the agent's log folder"):
        read_chunk(str(logs), LogRequest(instance="m-0", worker="w", offset=0))


LOG = b"--- gpuflow: starting llama-server -m /m.gguf --port 9000\nline one\nline two\n"  # 58 + 9 + 9 = 76 bytes


@pytest.mark.parametrize("offset, text, nxt", [
    (-1000, LOG.decode(), 76),  # more than the file: from its start, the command line included
    (-12, "line two\n", 76),  # 76 - 12 = 64 is inside 'line one' (58..66): skip to the next line, at 67
    (-9, "line two\n", 76),  # 76 - 9 = 67: already at a line boundary
    (-3, "wo\n", 76),  # 73 is inside the last line and no line starts after it: its tail beats nothing
    (59, "ine one\nline two\n", 76),  # an explicit offset (--follow) is read as asked
    (76, "", 76),
    (500, "", 76),  # past the end: nothing, the next read starts at the end
])
def test_reads_start_at_a_line(tmp_path, offset, text, nxt):
    (tmp_path / "m-0.log").write_bytes(LOG)
    chunk = read_chunk(str(tmp_path), LogRequest(instance="m-0", worker="w", offset=offset))
    assert (chunk.text, chunk.offset, chunk.found, chunk.more) == (text, nxt, True, False)


def test_a_read_stops_at_max_bytes_and_says_there_is_more(tmp_path):
    (tmp_path / "m-0.log").write_bytes(LOG)
    chunk = read_chunk(str(tmp_path), LogRequest(instance="m-0", worker="w", offset=0, max_bytes=60))
    assert (chunk.offset, chunk.more) == (60, True)  # 76 bytes: 60 read, 16 left
    chunk = read_chunk(str(tmp_path), LogRequest(instance="m-0", worker="w", offset=60, max_bytes=60))
    assert (chunk.text, chunk.offset, chunk.more) == ("ne one\nline two\n", 76, False)


def test_a_log_not_written_yet(tmp_path):
    chunk = read_chunk(str(tmp_path), LogRequest(instance="m-0", worker="w", offset=-100))
    assert (chunk.text, chunk.found) == ("", False)
