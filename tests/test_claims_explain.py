"""What ``explain --replay`` says of a decision that booked a learned claim (issue 42): the state
the decision keeps (scheduler/learned_claim.py) in the words the issue asks for, with how sure the
recommender was; nothing for a decision that booked none, or a kept state that does not read."""

from __future__ import annotations

import pytest

from scheduler.units import GiB
from views.render.explain import learned_line
from views.render.replay import replay

KEPT = {"claim": int(10.4 * GiB), "estimate": 14 * GiB, "fingerprint": "0123456789abcdef", "samples": 1240,
        "span_s": 3 * 86400.0, "percentile": 0.9, "margin": 0.15, "value": int(9.04 * GiB), "confidence": 0.8611,
        "bumped": False, "floor": 4 * GiB}

LINES = [
    ("learned", KEPT, "claim 10.4 GiB learned from 1,240 samples over 3 days (p90 9.04 GiB + 15%); the estimate was "
                      "14.0 GiB (confidence 0.86; fingerprint 0123456789ab)"),
    ("bumped after an OOM", {**KEPT, "bumped": True, "claim": int(16.8 * GiB)},
     "claim 16.8 GiB raised at once after an OOM or use over the claim; the estimate was 14.0 GiB "
     "(confidence 0.86; fingerprint 0123456789ab)"),
    ("held at the weights", {**KEPT, "claim": 12 * GiB, "floor": 12 * GiB},
     "claim 12.0 GiB learned from 1,240 samples over 3 days (p90 9.04 GiB + 15%), held at the weights' 12.0 GiB; "
     "the estimate was 14.0 GiB (confidence 0.86; fingerprint 0123456789ab)"),
    ("none booked", None, ""),
    ("a kept state that does not read", {"claim": "ten"}, ""),
]


@pytest.mark.parametrize("name, kept, line", LINES, ids=[x[0] for x in LINES])
def test_learned_line(name, kept, line):
    assert learned_line(kept) == line


def test_replay_says_it_booked_a_learned_claim():
    r = {"instance": "chat-1", "kind": "placement", "inputs": "ab" * 32, "at": "2026-12-04T11:00:00", "same": True,
         "now": "placed on box GPUs 0", "saw": "1 hosts, 1 replicas", "learned": KEPT}
    assert replay(r).splitlines() == [
        f"chat-1: decision of 2026-12-04T11:00:00 (inputs {'ab' * 6}, 1 hosts, 1 replicas)",
        f"booked {LINES[0][2]}",
        "same decision: placed on box GPUs 0"]
    assert "booked" not in replay({**r, "learned": None})
