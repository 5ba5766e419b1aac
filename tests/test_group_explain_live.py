"""``gpuflow explain MEMBER`` and ``--replay`` for a prefill/decode group on one dev stack (issue 41),
run as users run them (``gpuflow ... --address``): a 1P1D group of stand-in engines (real processes,
``gpuflow standin``) deployed with ``gpuflow deploy --wait``; each member's explain shows its own
placement and its group's decision (the host it gathered on, every member's role and GPUs); its
replay re-runs form() on the kept inputs and lands where it did; a prefill added by ``gpuflow scale
--role`` is placed alone and replays with scale_out(); ``--history`` lists them.

Arithmetic: the dev host ``box`` has two 24 GiB GPUs; a member of 4 GiB takes one GPU's share, so the
group gathers on box itself (the host layer, builtin-000004), and a third member fits there too."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.dev_stack import Dev, until

GiB = 2**30
STANDIN = f"{sys.executable} -m gpuflow standin --port {{port}} --host {{host}}"


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    d = Dev(tmp_path_factory.mktemp("group-explain"), gpus=(24, 24))
    try:
        until("the host is ready", lambda: re.search(r"^box\s.*ready", d.run("hosts"), re.M | re.I), timeout=60)
        yield d
    finally:
        d.stop()


def roles(dev: Dev, name: str) -> dict[str, str]:
    return {i["name"]: i["role"] for i in dev.instances(name) if i.get("state") != "deleted"}


def test_a_members_explain_shows_its_group_and_replays_it(dev):
    g = {"name": "pd", "backend": "custom", "run_command": STANDIN, "source": {"local_path": "/models/pd"},
         "resources": {"vram": 4 * GiB, "ram": GiB}, "disaggregation": {"mode": "custom"},
         "roles": [{"name": "prefill"}, {"name": "decode"}]}
    (dev.tmp / "pd.json").write_text(json.dumps(g))
    assert "RUNNING" in dev.run("deploy", str(dev.tmp / "pd.json"), "--wait", "--timeout", "120")
    by_role = {r: n for n, r in roles(dev, "pd").items()}
    decode, prefill = by_role["decode"], by_role["prefill"]

    text = dev.run("explain", decode)
    assert "decode of group pd: the group formed whole, gathered in box (builtin-000004)" in text
    assert re.search(rf"prefill\s+{prefill}\s+box GPUs", text) and re.search(rf"decode\s+{decode}\s+box GPUs", text)
    j = json.loads(dev.run("explain", decode, "--json"))
    assert j["group"]["kind"] == "group" and j["inputs"] and j["plan"]["worker"] == "box"
    assert sorted(m["name"] for m in j["group"]["members"]) == sorted([decode, prefill])

    # the replay re-runs the whole formation on what the decider saw (the keeper writes within a second)
    got = until("the formation kept", lambda: (p := _replay(dev, decode)) and p, timeout=30)
    assert got["same"] and got["kind"] == "group" and got["inputs"] == j["inputs"], got
    assert "same decision: placed on box" in dev.run("explain", prefill, "--replay")

    # one more prefill, placed alone after formation: kept under scale_out, replayed with scale_out()
    dev.run("scale", "pd", "2", "--role", "prefill")
    new = until("the new prefill placed", lambda: next((n for n, r in roles(dev, "pd").items()
                                                         if r == "prefill" and n != prefill
                                                         and _placed(dev, n)), None), timeout=90)
    assert "prefill of group pd: placed alone after formation (scale_out)" in dev.run("explain", new)
    alone = until("the scale-out kept", lambda: _replay(dev, new), timeout=30)
    assert alone["same"] and alone["kind"] == "scale_out", alone

    hist = dev.run("explain", "pd", "--history")
    assert re.search(rf"{decode}\s+placed \(group\)", hist) and re.search(rf"{new}\s+placed \(alone\)", hist)
    dev.run("delete", "pd")


def test_a_member_of_a_group_that_cannot_form_explains_why_naming_the_role(dev):
    # the decode asks for a host labelled tier=h200 and box is not: the group does not form, no member's workflow starts,
    # and explain answers from the kept refusal (through the control plane), naming decode
    g = {"name": "big", "backend": "custom", "run_command": STANDIN, "source": {"local_path": "/models/big"},
         "resources": {"vram": 4 * GiB, "ram": GiB}, "disaggregation": {"mode": "custom"},
         "roles": [{"name": "prefill"}, {"name": "decode", "worker_selector": {"tier": "h200"}}]}
    (dev.tmp / "big.json").write_text(json.dumps(g))
    dev.run("deploy", str(dev.tmp / "big.json"))
    decode = until("the members named", lambda: {r: n for n, r in roles(dev, "big").items()}.get("decode"), timeout=60)
    text = until("the refusal kept", lambda: (t := _explain(dev, decode)) and "does not fit" in t and t, timeout=60)
    assert "decode of group big: the group did not form: decode does not fit" in text, text
    assert "not placed, because" in text
    got = _replay(dev, decode)
    assert got["same"] and got["kind"] == "group" and "group big not formed: decode does not fit" in got["now"], got
    dev.run("delete", "big")


def _explain(dev: Dev, name: str) -> str | None:
    import subprocess

    p = subprocess.run([sys.executable, "-m", "gpuflow", "explain", name, "--address", dev.address],
                       capture_output=True, text=True, timeout=120)
    return p.stdout if p.returncode == 0 else None


def _replay(dev: Dev, name: str) -> dict | None:
    import subprocess

    p = subprocess.run([sys.executable, "-m", "gpuflow", "explain", name, "--replay", "--json", "--address",
                        dev.address], capture_output=True, text=True, timeout=120)
    return json.loads(p.stdout) if p.returncode in (0, 1) and p.stdout.strip().startswith("{") else None


def _placed(dev: Dev, name: str) -> bool:
    return any(i["name"] == name and i.get("worker") for i in dev.instances("pd"))
