"""``core.heap.give_back``: freed C heap pages go back to the system (glibc), a no-op elsewhere."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from edgekit.core import heap
from edgekit.core.resources import sample

MIB = 1 << 20


def _rss() -> int:
    rss = sample().rss_bytes
    assert rss is not None
    return rss


@pytest.mark.skipif(heap._malloc_trim() is None, reason="this C library has no malloc_trim (not glibc)")
def test_memory_freed_inside_the_heap_goes_back_to_the_system() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 MiB in 4 KiB blocks (below the mmap threshold: they come from the heap), each touched,
    # then all freed but the last: the block on top keeps the heap from shrinking by itself,
    # as a decoder's buffers freed under a live allocation do.
    blocks = [libc.malloc(4096) for _ in range(16384)]
    for b in blocks:
        ctypes.memset(b, 1, 4096)
    for b in blocks[:-1]:
        libc.free(b)
    before = _rss()
    assert heap.give_back() is True
    after = _rss()
    libc.free(blocks[-1])
    assert before - after > 32 * MIB, (before / MIB, after / MIB)


def test_without_malloc_trim_it_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.give_back() is False
