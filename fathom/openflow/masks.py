"""Value/mask matches for a range of integers (a port range in a TCP/UDP match field)."""
from __future__ import annotations


def range_to_masks(low: int, high: int, bits: int = 16) -> list[tuple[int, int]]:
    """The fewest (value, mask) pairs covering low..high exactly (prefix decomposition)."""
    out = []
    full = (1 << bits) - 1
    while low <= high:
        size = low & -low if low else 1 << bits
        while size > high - low + 1:
            size >>= 1
        out.append((low, full & ~(size - 1)))
        low += size
    return out
