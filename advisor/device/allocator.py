"""glibc malloc state for CPU timing, shared by measuring and `advisor.apply`.

A CPU conv's speed can depend several-fold on where glibc puts its buffers: fresh mmaps and
trimmed heap pages are page-faulted on every step. The state is process-wide, so measuring sets
it the same way for every candidate, and `advisor.apply` sets it at training start: what was timed
is what runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import torch


def release_free_heap() -> None:
    """glibc: hand free heap pages back to the OS. Otherwise a candidate's buffers can land in
    memory an earlier allocation left resident, and its peak would not show in the RSS at all
    (seen in a long-lived process: a 36 MiB conv output measured as 0 MB)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak is a lower bound there
        pass


_ALLOCATOR_SETTLED = False
SETTLE_BLOCK_BYTES = 31 * 2**20  # just under glibc's 32 MiB cap for the dynamic mmap threshold


def settle_cpu_allocator() -> None:
    """Put glibc malloc in the state of a training loop that has freed one large block.

    Until then glibc serves every allocation over 128 KiB with a fresh mmap, and returns freed
    heap memory above 32 MiB (twice that threshold) to the OS: both are page-faulted again on the
    next step. Freeing an mmapped block raises the mmap threshold to its size and the trim
    threshold to twice that, but only for blocks up to 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX): a
    32 MiB block, with its header, is over the cap and changes nothing. Measured on a CPU: a
    3->16 3x3 conv on 1x3x512x512 takes 10-13 ms per call unsettled (8,164 page faults per call)
    and 2-2.5 ms settled. Done once per process, by the measuring process before any candidate
    and by `advisor.apply` on a CPU, so both run in the same state; costs one 31 MiB allocation.
    """
    global _ALLOCATOR_SETTLED
    if not _ALLOCATOR_SETTLED:
        block = torch.empty(SETTLE_BLOCK_BYTES, dtype=torch.uint8)  # mmapped, then freed
        del block
        _ALLOCATOR_SETTLED = True
