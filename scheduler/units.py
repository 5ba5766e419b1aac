"""Byte units and rounding helpers shared by estimators, selectors and messages."""

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def gib(n: float) -> float:
    """Bytes to GiB rounded to 2 decimals, as GPUStack's messages print them."""
    return round(n / GiB, 2)


def pad(size: int, align: int) -> int:
    """Round ``size`` up to a multiple of ``align`` (a power of two)."""
    return (size + align - 1) & ~(align - 1)
