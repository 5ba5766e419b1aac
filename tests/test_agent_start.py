"""What ``gpuflow agent`` checks before it connects to Temporal, and ``gpuflow hosts join-token``,
run as an operator runs them: a broken inventory file or a missing join token is named at once,
not after 30 s of "cannot reach Temporal" (nothing listens at the address given); the join token
is read from the store itself, and one that no control plane has made is named."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from contracts import credential as cr
from gpuflow.ports import server_port
from store import db, host_credentials

NOWHERE = ["--address", f"127.0.0.1:{server_port()}"]  # no Temporal listens there


def gpuflow(*args: str, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpuflow", *args], capture_output=True, text=True, timeout=120,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("GPUFLOW_")}, **(env or {})})
    return time.monotonic() - started, p


def test_a_broken_inventory_is_named_before_temporal_is_asked(tmp_path):
    inv = tmp_path / "bad.yaml"
    inv.write_text(yaml.safe_dump({"ram_total": "64 GiB", "gpus": [{"index": 0, "vram_total": "lots"}]}))
    took, p = gpuflow("agent", "--name", "h1", "--inventory", str(inv), "--data-dir", str(tmp_path), *NOWHERE)
    assert p.returncode == 2 and "inventory file" in p.stderr and "vram_total" in p.stderr, p.stderr
    assert "cannot reach Temporal" not in p.stderr and took < 20, (took, p.stderr)


def test_a_host_that_never_joined_needs_the_token_and_is_told_where_it_is(tmp_path):
    took, p = gpuflow("agent", "--name", "h1", "--data-dir", str(tmp_path), *NOWHERE)
    assert p.returncode == 2 and "host h1 has not joined this cluster yet" in p.stderr, p.stderr
    assert "gpuflow hosts join-token" in p.stderr and took < 20
    token_file = tmp_path / "token"
    token_file.write_text("gfjoin1.nope.nope\n")
    _, p = gpuflow("agent", "--name", "h1", "--data-dir", str(tmp_path), "--join-token-file", str(token_file),
                   *NOWHERE)
    assert p.returncode == 2 and "the join token" in p.stderr and "nope" not in p.stderr, p.stderr  # never echoed


def test_join_token_is_read_from_the_store(tmp_path):
    _, p = gpuflow("hosts", "join-token", "--data-dir", str(tmp_path / "none"))
    assert p.returncode == 2 and "no store at" in p.stderr, p.stderr
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "gpuflow.db")))
    db.init_db(engine)  # what a control plane does as it starts
    keys = host_credentials.cluster_keys(engine)
    engine.dispose()
    _, p = gpuflow("hosts", "join-token", "--data-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert cr.parse_join_token(p.stdout.strip()) == (keys.join_secret, keys.public)
    assert "keep it secret" in p.stderr
    # the same store through the environment, as every other offline command reads it
    _, p = gpuflow("hosts", "join-token", env={"GPUFLOW_DATABASE_URL": db.sqlite_url(str(tmp_path / "gpuflow.db"))})
    assert p.returncode == 0 and p.stdout.count(".") == 2, p.stderr


def test_simulate_takes_the_token_as_an_agent_does_or_from_the_store_at_hand(tmp_path, monkeypatch):
    from gpuflow.settings import Settings
    from gpuflow.simulate import fleet_token
    from scheduler.errors import InvalidInput

    for k in [k for k in os.environ if k.startswith("GPUFLOW_")]:
        monkeypatch.delenv(k)
    here = Settings().model_copy(update={"data_dir": str(tmp_path)})
    with pytest.raises(InvalidInput, match="GPUFLOW_AGENT__JOIN_TOKEN.*--data-dir"):
        fleet_token(here)  # no token, and no store here
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "gpuflow.db")))
    db.init_db(engine)
    token = host_credentials.join_token(engine)
    engine.dispose()
    assert fleet_token(here) == token  # the control plane's own machine: its store gives it
    f = tmp_path / "token"
    f.write_text("gfjoin1.given.here\n")
    assert fleet_token(here, str(f)) == "gfjoin1.given.here"  # a token given wins (checked as each host joins)
    monkeypatch.setenv("GPUFLOW_AGENT__JOIN_TOKEN", "gfjoin1.from.env")
    assert fleet_token(Settings()) == "gfjoin1.from.env"
