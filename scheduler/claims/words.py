"""The words the recommender and its renderers share: sizes and history spans."""

from __future__ import annotations

from scheduler.units import GiB, MiB


def size(n: int | float | None) -> str:
    """Bytes as people read them: 10.4 GiB, 920 MiB."""
    if n is None:
        return "-"
    if abs(n) >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def duration(s: float) -> str:
    """A span in its largest whole unit: 3 days, 5 h, 12 min, 40 s."""
    if s >= 2 * 86_400:
        return f"{s / 86_400:.0f} days"
    if s >= 86_400:
        return "1 day" if s < 1.05 * 86_400 else f"{s / 86_400:.1f} days"
    if s >= 3600:
        return f"{s / 3600:.0f} h"
    if s >= 60:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def history_words(samples: int, span_s: float) -> str:
    """'1,240 samples over 3 days'."""
    return f"{samples:,} sample{'s' if samples != 1 else ''} over {duration(span_s)}"
