"""Memory gpuflow does not own: what processes it did not start hold on a GPU (``vram_foreign``,
NVML's used less gpuflow's own processes; a simulated GPU's ``vram_used_by_others``), and the
three things the policy does with it. Pure: figures in, figures and words out.

- **Booked around, with a margin.** A foreign process grows (a notebook's PyTorch cache, a
  desktop session, a second job), and the figure is a sample. The fit counts it as
  ``foreign + ceil(foreign x margin)`` (``GPUFLOW_SCHEDULER__FOREIGN_MEMORY_MARGIN``, default 0.1:
  10 GiB used elsewhere keeps 11 GiB off the books; scheduler/allocatable.py).
- **Named when it refuses.** A replica that does not fit where other processes hold memory says so,
  GPU by GPU ("worker g1: GPU 0: 10.0 GiB used by other processes"), among its decisive reasons,
  so ``explain`` and the PENDING reason show it.
- **Judged when it grows.** Once placed, nothing gpuflow runs is moved for it. When foreign use
  grows past the room gpuflow's bookings left on a card (total - reserve - booked), the host is
  *degraded*: an alert with the figures (``gpuflow hosts``, the console, the metrics), never an
  eviction (Kubernetes evicts under node memory pressure; a GPU has no such pressure signal, and
  killing a serving replica for another user's job is the wrong way round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.units import GiB

MOST_NAMED = 4  # GPUs named in one refusal line; the rest are counted


def with_margin(foreign: int | None, margin: float) -> int:
    """What the fit books for ``foreign`` bytes held by other processes: foreign + ceil(foreign x margin)."""
    if not foreign:
        return 0
    return foreign + math.ceil(foreign * margin)


def words(foreign: int) -> str:
    """'3.2 GiB used by other processes': one decimal, as people read a card's memory."""
    return f"{foreign / GiB:.1f} GiB used by other processes"


PREFIX = "foreign memory: "


def _named(held: list[tuple[str, int, int]], margin: float) -> str:
    named = [f"worker {w}: GPU {i}: {words(f)}" + (f" ({with_margin(f, margin) / GiB:.1f} GiB kept off the books "
                                                    f"with the {margin:.0%} margin)" if margin else "")
             for w, i, f in held[:MOST_NAMED]]
    more = f"; and {len(held) - MOST_NAMED} more GPU(s) hold memory of other processes" if len(held) > MOST_NAMED else ""
    return PREFIX + "; ".join(named) + more


def refusal(workers, margin: float) -> str | None:
    """One line naming the foreign use on the GPUs of ``workers`` (those the filters kept), or
    None when none holds any: 'foreign memory: worker g1: GPU 0: 10.0 GiB used by other processes
    (11.0 GiB kept off the books with the 10% margin)'."""
    held = [(w.name, g.index, g.vram_foreign) for w in workers for g in w.gpus if g.vram_foreign]
    return _named(held, margin) if held else None


def placed_note(worker, gpu_indexes: list[int], margin: float) -> str | None:
    """The same line for the GPUs a placement took (``explain`` shows it), or None when other
    processes hold nothing there."""
    held = [(worker.name, g.index, g.vram_foreign) for g in worker.gpus if g.index in gpu_indexes and g.vram_foreign]
    return _named(held, margin) if held else None


@dataclass(frozen=True)
class Degraded:
    """A card whose foreign use grew past the room gpuflow's bookings left on it."""

    index: int
    foreign: int
    booked: int
    room: int  # total - reserve - booked: what other processes could hold without squeezing gpuflow's

    def text(self) -> str:
        return (f"GPU {self.index}: {words(self.foreign)}, past the {self.room / GiB:.1f} GiB gpuflow's bookings "
                f"leave free ({self.booked / GiB:.1f} GiB booked); its replicas may run out of memory; "
                "nothing is evicted")


def degradations(gpus, reserved_vram: int, booked: dict[int, int]) -> list[Degraded]:
    """The cards of one host whose foreign use is past the room its bookings leave: foreign >
    total - reserve - booked, where something is booked (a card gpuflow holds nothing on is not
    gpuflow's to be squeezed on). ``gpus``: objects with index, vram_total and vram_foreign."""
    out = []
    for g in gpus:
        b = booked.get(g.index, 0)
        if not b or not g.vram_foreign:
            continue
        room = max(g.vram_total - reserved_vram - b, 0)
        if g.vram_foreign > room:
            out.append(Degraded(g.index, g.vram_foreign, b, room))
    return out
