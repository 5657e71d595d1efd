"""glibc malloc state for CPU timing, shared by measuring and `advisor.apply`.

A CPU conv's speed can depend several-fold on where glibc puts its buffers: fresh mmaps and
trimmed heap pages are page-faulted on every step. The state is process-wide, so measuring sets
it the same way for every candidate, and `advisor.apply` sets it at training start: what was timed
is what runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools

import torch


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, found once (`find_library` runs `ldconfig -p` in a subprocess)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def release_free_heap() -> None:
    """glibc: hand free heap pages back to the OS. Otherwise a candidate's buffers can land in
    memory an earlier allocation left resident, and its peak would not show in the RSS at all
    (a 36 MiB conv output can read as 0 MB in a long-lived process)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the peak is a lower bound
        _libc().malloc_trim(0)


_RESIDENT = False
RESIDENT_BLOCK_BYTES = 31 * 2**20  # just under glibc's 32 MiB cap for the dynamic mmap threshold
# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4


def keep_cpu_buffers_resident() -> None:
    """Put glibc malloc in the state of a training loop whose buffers stay resident: a step's
    large buffers are page-faulted once, on its first call, not on every call.

    In a fresh process glibc serves every allocation over 128 KiB with a fresh mmap, and returns
    freed heap memory above 32 MiB (twice that threshold) to the OS: both are page-faulted again
    on the next step. Freeing an mmapped block raises the mmap threshold to its size and the trim
    threshold to twice that, but only for blocks up to 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX), so
    one 31 MiB block, allocated and freed, keeps every buffer up to 31 MiB resident.

    A buffer over 32 MiB would still be mmapped afresh on every call, so the first candidate
    timed in a process (before other candidates' buffers have grown the heap) would read up to
    3x slow. So glibc is also told to serve every block from the heap (`M_MMAP_MAX` 0) and never
    to trim it (`M_TRIM_THRESHOLD` -1, which glibc's mallopt documents as "disables trimming
    completely"): whatever its size, a buffer freed at the end of a step is reused by a later
    one, and the page faults are the first calls' (a large buffer's blocks can take a few steps
    to be reused). A thread's arena still mmaps a block too large for its heap (64 MiB);
    PyTorch's CPU ops allocate on the calling thread. The measuring process's resident memory is
    handed back between trials (`release_free_heap`, for their peaks), a training process keeps
    its high-water mark, as PyTorch's CUDA caching allocator does.

    Done once per process, by the measuring process before any candidate and by
    `advisor.apply` on a CPU, so both run in the same state.
    """
    global _RESIDENT
    if not _RESIDENT:
        block = torch.empty(RESIDENT_BLOCK_BYTES, dtype=torch.uint8)  # mmapped, then freed
        del block
        with contextlib.suppress(OSError, AttributeError):  # not glibc: the 31 MiB block alone
            _libc().mallopt(M_MMAP_MAX, 0)
            _libc().mallopt(M_TRIM_THRESHOLD, -1)
        _RESIDENT = True
