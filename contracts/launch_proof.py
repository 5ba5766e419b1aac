"""A launch's result, proven by the host that launched it: where a replica's server listens is the
host's word, so the agent MACs its LaunchResult with its host key (contracts/credential.py ``sign``,
purpose "launch") and the store writes a replica RUNNING at an address only when that MAC verifies
with the credential of the host the ledger booked it on (store/engine_keys.py ``check_launches``).

Without it, anyone who can reach Temporal could run a workflow named for a replica whose own
workflow is not running (one deleted, say) and record it RUNNING at an address of theirs: the
gateways would route users there and send it the engine key. The MAC covers what the gateways and
the store use: the instance, its part, the pid, the port, the address, the engine key's nonce, the
KV-events port and the KV hand-off (bootstrap) port; the nonce is its stamp (each launch has its own), so a MAC read from a history
proves only that launch, at its own address. An adopted process's result carries the same figures,
and so the same MAC."""

from __future__ import annotations

from typing import Any

from contracts import credential as cr

PURPOSE = "launch"
MAC_PATTERN = r"^([0-9a-f]{64})?$"  # an HMAC-SHA256 in hex, or "" (an agent with no credential)


def body(instance: str, part: str, pid: int | None, port: int | None, address: str | None, key_id: str | None,
         kv_events_port: int | None, bootstrap_port: int | None = None) -> dict[str, Any]:
    """What a launch's MAC covers (both ends build it from the same figures). The bootstrap port
    only when there is one: a launch without one has the MAC it had before the field existed."""
    out = {"instance": instance, "part": part, "pid": pid, "port": port, "address": address or "",
           "key_id": key_id or "", "kv_events_port": kv_events_port}
    return out if bootstrap_port is None else {**out, "bootstrap_port": bootstrap_port}


def sign(key: bytes, host: str, fields: dict[str, Any]) -> str:
    """The MAC of one launch on ``host`` (``fields``: ``body``'s)."""
    return cr.sign(key, PURPOSE, host, fields["key_id"], fields)


def problem(key: bytes | None, host: str, fields: dict[str, Any], mac: str | None) -> str | None:
    """Why ``mac`` does not prove this launch on ``host`` (None: it does). ``key``: the key the host
    shares with the control plane (None: the host has no credential in the store)."""
    what = f"instance {fields['instance']}'s launch on host {host}"
    if key is None:
        return f"{what} cannot be checked: host {host} has not joined (or was forgotten)"
    if not mac:
        return f"{what} carries no MAC: not reported by {host}'s agent (or by an agent older than launch proofs)"
    if not cr.verify(key, PURPOSE, host, fields["key_id"], fields, mac):
        return (f"{what} does not verify with {host}'s credential (pid {fields['pid']}, port {fields['port']}, "
                f"address {fields['address']!r}): altered, or reported by another host")
    return None
