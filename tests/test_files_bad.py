"""Cluster and model files that are not text, nest absurdly deep or expand without bound give
a clear error naming the file (exit 2), never a traceback. Through the CLI, as people run it."""

from __future__ import annotations

import os

import pytest

from tests.test_cli import CLUSTER, EXAMPLES, gpuflow

MODEL = os.path.join(EXAMPLES, "model-custom.yaml")
# YAML aliases: 10 x's, then 9 levels each repeating the previous one 10 times = 10^10 values
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9))


@pytest.mark.parametrize("name, body, message", [
    # "workers:\n" is 9 bytes, "- name: h" 9 more: the Latin-1 é is byte 18, on line 2
    ("latin1.yaml", b"workers:\n- name: h\xe9te\n", "not UTF-8 text: byte 0xe9 at offset 18 (line 2)"),
    ("deep.yaml", b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "not valid YAML: nested too deeply"),
    ("deepmap.yaml", b"a: " + b"{b: " * 100_000 + b"1" + b"}" * 100_000 + b"\n", "not valid YAML: nested too deeply"),
    ("deep.json", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON: nested too deeply"),
    ("deep70.json", b'{"a": ' + b"[" * 70 + b"]" * 70 + b"}", "nested more than 64 levels deep"),
    ("bomb.yaml", BOMB.encode(), "more than 1,000,000 values (YAML aliases expanded)"),
    # valid JSON, but one byte over the 64 MiB limit: the JSON fast path refuses it as the slow one does
    ("big.json", b'{"version": 1' + b" " * ((64 << 20) - 13) + b"}", "larger than 64 MiB; refused"),
])
@pytest.mark.parametrize("flag", ["--cluster", "--model"])
def test_bad_files_exit_2_naming_the_file(tmp_path, name, body, message, flag):
    bad = tmp_path / name
    bad.write_bytes(body)
    args = ["--cluster", str(bad), "--model", MODEL] if flag == "--cluster" else ["--cluster", CLUSTER, "--model", str(bad)]
    p = gpuflow("schedule", *args, check=2)
    assert f"{bad}: " in p.stderr and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
