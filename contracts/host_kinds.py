"""A host's kind (real, mock GPUs, simulated) and its words, as the CLI, the console and the
Temporal UI show them. Apart from contracts/host.py (which re-exports them) so that the CLI's views
(views/render/cluster.py, contracts/ui_text.py) do not bring the host's report and the decision
types with them (issue 37: ``gpuflow deploy``'s start). Imports nothing."""

from __future__ import annotations

# The two kinds of host whose GPUs are not NVML's, and their words everywhere a host is shown
# (gpuflow hosts, the console, the Temporal UI): issue 36 found one word, "simulated", for both.
HOST_KINDS = {
    "real": "NVML's GPUs; engines run as processes",
    "mock-gpus": "GPUs from an inventory file; engines run as real processes (gpuflow dev --demo, tests)",
    "simulated": "gpuflow simulate's: GPUs from an inventory file, and nothing runs (replicas are simulated)",
}


def host_kind(simulated: bool, runs: str | None) -> str:
    """A host's kind (HOST_KINDS). A report from an agent older than ``runs`` with simulated GPUs
    could be either: it keeps the word it had, ``simulated``."""
    if runs == "nothing":
        return "simulated"
    if not simulated:
        return "real"
    return "mock-gpus" if runs == "processes" else "simulated"
