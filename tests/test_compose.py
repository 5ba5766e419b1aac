"""The compose file hangs together: every dependency and mounted file exists, gpuflow's control
plane points at Temporal and its own database, and Prometheus scrapes it; and Compose itself
validates it (`docker compose config`, or `docker-compose config` from Debian's docker-compose
package, where either is installed)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(path: str):
    with open(os.path.join(ROOT, path)) as f:
        return yaml.safe_load(f)


def test_compose_is_consistent():
    c = load("docker-compose.yml")
    services = c["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", [])
        for d in deps if isinstance(deps, list) else deps.keys():
            assert d in services, f"{name} depends on unknown service {d}"
        for v in svc.get("volumes", []):
            src = v.split(":", 1)[0]
            if src.startswith("./"):
                assert os.path.exists(os.path.join(ROOT, src)), f"{name} mounts missing {src}"
            else:
                assert src in c["volumes"], f"{name} uses undeclared volume {src}"
        assert "image" in svc or "build" in svc
    env = services["gpuflow-control"]["environment"]
    assert env["GPUFLOW_TEMPORAL__ADDRESS"] == "temporal:7233"
    assert env["GPUFLOW_DATABASE_URL"].startswith("postgresql://") and "@gpuflow-db:5432/" in env["GPUFLOW_DATABASE_URL"]
    assert os.path.exists(os.path.join(ROOT, "Dockerfile"))


def test_published_ports_bind_loopback_by_default():
    """Nothing the file publishes has authentication by default: each port binds to
    GPUFLOW_PUBLISH_ADDRESS, which defaults to 127.0.0.1 (never all interfaces)."""
    published = {name: svc["ports"] for name, svc in load("docker-compose.yml")["services"].items() if "ports" in svc}
    assert {"temporal", "temporal-ui", "prometheus", "grafana"} <= set(published)
    for name, ports in published.items():
        for p in ports:
            assert str(p).startswith("${GPUFLOW_PUBLISH_ADDRESS:-127.0.0.1}:"), f"{name} publishes {p} on every interface"


def test_no_two_services_and_not_the_gateway_share_a_host_port():
    """The stack runs beside a gateway on its default port (gpuflow gateway: 8080): the UI is
    published on 8233, as the dev server's, and every host port is published once."""
    from gateway.config import GatewaySettings

    host_ports = [str(p).rsplit(":", 2)[1] for svc in load("docker-compose.yml")["services"].values()
                  for p in svc.get("ports", [])]
    assert len(host_ports) == len(set(host_ports)), host_ports
    assert str(GatewaySettings().port) not in host_ports
    assert "8233" in host_ports


def test_prometheus_scrapes_the_control_plane():
    p = load("deploy/prometheus/prometheus.yml")
    jobs = {j["job_name"]: j for j in p["scrape_configs"]}
    assert jobs["gpuflow-control"]["dns_sd_configs"][0]["port"] == 9400
    assert load("deploy/grafana/provisioning/datasources/prometheus.yml")["datasources"][0]["url"] == "http://prometheus:9090"


def compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.skipif(compose_command() is None, reason="neither docker compose nor docker-compose is installed")
def test_compose_config_validates():
    out = subprocess.run(compose_command() + ["-f", os.path.join(ROOT, "docker-compose.yml"), "-p", "gpuflow", "config"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "gpuflow-control" in out.stdout and "temporal-ui" in out.stdout
