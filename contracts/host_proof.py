"""A host's report, signed by its agent and judged by the control plane: the rule, as pure functions
(keys, clocks and the store's record are passed in). The agent signs with ``sign``
(worker_agent/credential.py); the host workflow's local activity (activities/host_auth.py) reads
the store and calls ``judge``, before the report changes anything.

The rule, in the order it is checked (the anchor: Kubernetes' NodeRestriction, which lets a
kubelet's credential change only its own Node):

1. the report is a JSON object with an ``auth`` that parses (else ``unsigned`` or ``garbage``);
2. its public key is the one the host joined with (else ``other_credential``: a second agent with
   a live host's name); a host not joined yet shows a join proof made with this cluster's join
   secret for this name and this key (else ``not_joined``);
3. its MAC verifies with the key that host and control plane share (else ``mac``): the report is
   the host's, unaltered, for this purpose and this stamp;
4. it is fresh (else ``stale`` or ``replay``): a hello's stamp (the agent's clock, in ms) is within
   HELLO_SKEW_S of the workflow's clock and later than the last hello accepted from the host, by
   the workflow and by the store; the same hello checked again (a local activity run twice) passes;
   a watch's stamp is the nonce the workflow sent with that watch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import ValidationError

from contracts import credential as cr
from contracts.host_auth import HELLO_SKEW_S, HostAuth, Purpose, ReportCheck, ReportVerdict


@dataclass(frozen=True)
class ClusterKeys:
    """The control plane's: its X25519 private key (raw bytes), the public key, the join secret."""

    secret: bytes
    public: str
    join_secret: bytes


@dataclass(frozen=True)
class Known:
    """What the store holds for a joined host: its public key, and the last hello accepted."""

    public: str
    hello_ms: int = 0
    hello_mac: str = ""


def body_of(raw: dict[str, Any]) -> dict[str, Any]:
    """What a report's MAC covers: the report as it was sent, without its ``auth``."""
    return {k: v for k, v in raw.items() if k != "auth"}


def sign(body: dict[str, Any], key: bytes, purpose: Purpose, host: str, stamp: str, public: str,
         proof: str) -> dict[str, Any]:
    """``body`` (a report's model_dump(mode="json") without auth) with its auth, ready to send."""
    mac = cr.sign(key, purpose, host, stamp, body_of(body))
    return {**body_of(body), "auth": HostAuth(public=public, proof=proof, stamp=stamp, mac=mac).model_dump()}


def refused(kind: str, why: str) -> ReportVerdict:
    return ReportVerdict(ok=False, kind=kind, why=why[:1000])


def _auth_of(check: ReportCheck) -> HostAuth | ReportVerdict:
    h, what = check.host, f"host {check.host}'s {check.purpose} report"
    if check.report is None:
        return refused("garbage", f"{what} is not a JSON object")
    raw = check.report.get("auth")
    if raw is None:
        return refused("unsigned", f"{what} carries no credential (auth): sent by an agent older than host "
                                   f"credentials, or by something that is not {h}'s agent")
    try:
        return HostAuth.model_validate(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"])) or "auth"
        return refused("garbage", f"{what} has an auth that is not one: {where}: {first['msg']}")


def _key(check: ReportCheck, auth: HostAuth, cluster: ClusterKeys, known: Known | None,
         key_of: Callable[[str], bytes]) -> bytes | ReportVerdict:
    """The key the report must be MACed with, or why there is none for its public key."""
    h = check.host
    if known is not None and known.public != auth.public:
        return refused("other_credential", f"host {h} is joined with another credential: stop that agent, or run "
                                           f"'gpuflow hosts forget {h}' once it is gone")
    if known is None and not cr.verify_join(cluster.join_secret, h, auth.public, auth.proof):
        return refused("not_joined", f"host {h} has not joined, and its report's join proof does not verify: "
                                     "start its agent with this cluster's join token ('gpuflow hosts join-token' "
                                     "prints it)")
    try:
        return key_of(auth.public)
    except ValueError as e:  # not a point X25519 takes
        return refused("garbage", f"host {h}'s public key is not a key: {e}")


def _fresh(check: ReportCheck, auth: HostAuth, known: Known | None) -> int | ReportVerdict:
    """A hello's stamp (ms) when it is fresh, 0 for a watch that answers this watch; or why not."""
    h = check.host
    if check.purpose == "watch":
        if not check.nonce or auth.stamp != check.nonce:
            return refused("replay", f"host {h}'s watch report answers another watch than this one (its stamp is "
                                     "not this watch's nonce): a report replayed from a history")
        return 0
    if not auth.stamp.isdigit() or len(auth.stamp) > 16:
        return refused("garbage", f"host {h}'s hello is stamped {auth.stamp[:20]!r}, not a time in milliseconds")
    stamp = int(auth.stamp)
    off_s = (stamp - check.now_ms) / 1000
    if abs(off_s) > HELLO_SKEW_S:
        return refused("stale", f"host {h}'s hello is stamped {off_s:+.0f} s from the control plane's clock (at "
                                f"most {HELLO_SKEW_S} s either way): replayed, or the host's clock is off")
    again = known is not None and stamp == known.hello_ms and auth.mac == known.hello_mac
    if stamp <= check.after_ms or (known is not None and stamp <= known.hello_ms and not again):
        return refused("replay", f"host {h}'s hello is stamped no later than the last hello accepted from it: "
                                 "a hello replayed from a history")
    return stamp


def judge(check: ReportCheck, cluster: ClusterKeys, known: Known | None,
          key_of: Callable[[str], bytes] | None = None) -> ReportVerdict:
    """The verdict on one report (the module's rule). ``known``: the store's record of the host
    (None: not joined); ``key_of(public)``: the host key for a public key (a cache may stand in)."""
    auth = _auth_of(check)
    if isinstance(auth, ReportVerdict):
        return auth
    key = _key(check, auth, cluster, known, key_of or (lambda public: cr.host_key(cluster.secret, public)))
    if isinstance(key, ReportVerdict):
        return key
    assert check.report is not None  # _auth_of refused a report that is not an object
    if not cr.verify(key, check.purpose, check.host, auth.stamp, body_of(check.report), auth.mac):
        return refused("mac", f"host {check.host}'s {check.purpose} report does not verify with its credential "
                              "(its MAC): altered on the way, or signed with another key")
    stamp = _fresh(check, auth, known)
    if isinstance(stamp, ReportVerdict):
        return stamp
    return ReportVerdict(ok=True, joined=known is None, stamp_ms=stamp)
