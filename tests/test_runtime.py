"""Connection options: mTLS needs both halves, an API key implies TLS, an unreachable server is
named, and the CLI says so with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuflow.ports import server_port
from gpuflow.runtime import tls_config
from gpuflow.settings import TemporalSettings
from scheduler.errors import InvalidInput


def test_tls_options(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_bytes(b"CERT")
    key.write_bytes(b"KEY")
    assert tls_config(TemporalSettings()) is False
    assert tls_config(TemporalSettings(api_key="k")) is True  # API keys only travel over TLS
    t = tls_config(TemporalSettings(tls_cert=str(cert), tls_key=str(key)))
    assert (t.client_cert, t.client_private_key) == (b"CERT", b"KEY")
    with pytest.raises(InvalidInput, match="both --tls-cert and --tls-key"):
        tls_config(TemporalSettings(tls_cert=str(cert)))
    with pytest.raises(InvalidInput, match="missing.pem"):
        tls_config(TemporalSettings(tls_cert=str(tmp_path / "missing.pem"), tls_key=str(key)))


def test_cli_names_an_unreachable_server():
    out = subprocess.run([sys.executable, "-m", "gpuflow", "status", "--address", f"127.0.0.1:{server_port()}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 4 and "cannot reach Temporal at 127.0.0.1:" in out.stderr, out.stderr  # not invalid input
