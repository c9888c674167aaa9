"""The C heap kept between a plan's calls.

A plan's kernels allocate their intermediate tensors in every call and free them at its end. With
glibc's defaults, freed memory at the top of the heap beyond a trim threshold (which glibc raises
as the program runs, up to 64 MiB) goes back to the system, and the next call faults it in again,
page by page; whether it does depends on what else the process allocated, so one plan can run at
different speeds in different processes. keep_heap() sets the trim threshold to HEAP_KEEP_BYTES
and serves allocations of up to 32 MiB (the most glibc accepts for its mmap threshold) from the
heap, which setting a threshold requires: glibc stops adjusting both once one is set. korch calls
it when it builds a plan's executable, in its profiling workers and before it times a rewrite, so
that kernels are timed as plans run. Nothing happens where the C library is not glibc, or where
`KORCH_KEEP_HEAP=0`."""

from __future__ import annotations

import ctypes
import os
import platform

from korch.config import HEAP_KEEP_BYTES

M_TRIM_THRESHOLD = -1  # mallopt's parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_MOST = 32 << 20  # HEAP_MAX_SIZE / 2 on 64-bit glibc: mallopt refuses a larger mmap threshold

_kept: bool | None = None


def keep_heap() -> bool:
    """Keep freed memory in this process (see above); whether glibc took the settings. Once per process."""
    global _kept
    if _kept is None:
        _kept = _set_thresholds()
    return _kept


def _set_thresholds() -> bool:
    if os.environ.get("KORCH_KEEP_HEAP", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_MOST)) and bool(mallopt(M_TRIM_THRESHOLD, HEAP_KEEP_BYTES))
