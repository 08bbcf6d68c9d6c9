"""Memory lent to results the caller owns: a block goes back on a shelf when the last view of
it dies, and the next call that needs about its size takes it again, its pages already mapped.

A loop that drops each call's results (``i, j, S, d = neighbor_list(...)`` step after step)
then never meets fresh memory, whose first touch costs a page fault every 4 KiB or, for
NumPy's huge pages, a wait while the kernel compacts memory (a 10^5-atom list: 173 ms a call
alone, 436 right after another library freed gigabytes). Results the caller keeps are never
written again.

State kept across calls (listed in docs/architecture.md): the shelf, at most SHELF_BLOCKS
blocks of the results dropped last, for the whole process (``release_memory`` empties it).
"""

from __future__ import annotations

import collections

import numpy as np

SHELF_BLOCKS = 2
_SHELF: collections.deque = collections.deque()  # raw int64 arrays; append and popleft are atomic


def lend(nbytes: int) -> np.ndarray:
    """An uninitialised int64 array of at least ``nbytes`` bytes whose memory goes back on the
    shelf when it and every view of it (NumPy's, or a framework's over NumPy's) are gone."""
    size = max(64 << 10, 1 << (max(nbytes, 1) - 1).bit_length())  # sizes a loop's calls share
    raw = _taken(nbytes, 2 * size)
    if raw is None:
        raw = np.empty(size // 8, dtype=np.int64)
    return np.asarray(_Lent(raw))


def release_memory() -> None:
    """Hand back the memory warpbridge keeps for the next ``neighbor_list`` results: the blocks
    of the results you dropped (at most two; after a call on 10^6 atoms, about 2.5 GB). Results
    you still hold are not touched; the next call then writes into fresh memory."""
    _SHELF.clear()


def _taken(nbytes: int, most: int) -> np.ndarray | None:
    """The smallest block on the shelf of ``nbytes`` to ``most`` bytes, off the shelf; None
    where none fits. Lock-free: a block another thread has off the shelf for a moment is
    missed, never handed out twice."""
    seen = []
    for _ in range(len(_SHELF)):
        try:
            seen.append(_SHELF.popleft())
        except IndexError:
            break
    fits = [r for r in seen if nbytes <= r.nbytes <= most]
    best = min(fits, key=lambda r: r.nbytes) if fits else None
    for r in seen:
        if r is not best:
            _SHELF.append(r)
    _evict()
    return best


def _evict() -> None:
    while len(_SHELF) > SHELF_BLOCKS:
        try:
            _SHELF.popleft()
        except IndexError:
            return


class _Lent:
    """The base of a lent block's views: NumPy reads the block through ``__array_interface__``
    and keeps this object alive while any view lives; when it dies, the block goes back."""

    def __init__(self, raw: np.ndarray) -> None:
        self.raw = raw
        self.__array_interface__ = raw.__array_interface__

    def __del__(self) -> None:
        _SHELF.append(self.raw)
        _evict()
