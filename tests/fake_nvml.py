"""An in-memory NVML (the pynvml calls the agent and bench/gpu_foreign_memory.py make) over a list
of cards, each a dict: ``total``, ``used`` (default: the processes' sum), ``name``, ``procs`` (a
list of (pid, bytes); absent: the driver lists no processes) and ``vram_used_by_others``: bytes
held by a process gpuflow did not start (pid OTHER_PID), added to the processes and to used, as
a simulated inventory declares it."""

from __future__ import annotations

from types import SimpleNamespace

OTHER_PID = 1  # init: never a process gpuflow started


class FakeNVML:
    def __init__(self, cards: list[dict]):
        self.cards, self.open = cards, 0

    def nvmlInit(self):  # noqa: N802
        self.open += 1

    def nvmlShutdown(self):  # noqa: N802
        self.open -= 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return self.cards[i]

    def _procs(self, h) -> list[tuple[int, int]] | None:
        if "procs" not in h and "vram_used_by_others" not in h:
            return None
        others = [(OTHER_PID, h["vram_used_by_others"])] if h.get("vram_used_by_others") else []
        return list(h.get("procs", [])) + others

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        used = h.get("used", sum(b for _, b in self._procs(h) or []))
        return SimpleNamespace(total=h["total"], used=used, free=h["total"] - used)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return h.get("name", "NVIDIA H200")

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return h.get("uuid", "GPU-00000000-0000-0000-0000-000000000000")

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        procs = self._procs(h)
        if procs is None:
            raise RuntimeError("NVMLError_NotSupported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in procs]
