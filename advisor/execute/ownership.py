"""Which process owns a RUNNING trial, and whether it is still alive.

A trial records its owner as `host/boot-id:pid:start-ticks`; on the same host, a dead owner (or a
recycled pid) is seen at once, so its trial is retried; other hosts are left to heartbeats.
"""

from __future__ import annotations

import os
import socket

__all__ = ["owner_dead", "owner_id"]


def _start_ticks(pid: int) -> str | None:
    """A process's start time (Linux), so a recycled pid is not taken for the original."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _host_id() -> str:
    """This machine: its hostname and (Linux) boot id, so two machines that share a hostname are
    not taken for one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{socket.gethostname()}/{f.read().strip()[:8]}"
    except OSError:
        return socket.gethostname()


def owner_id() -> str:
    pid = os.getpid()
    return f"{_host_id()}:{pid}:{_start_ticks(pid) or ''}"


def owner_dead(owner: str) -> bool:
    """True only when the owner ran on this host and is gone; other hosts: heartbeats decide."""
    host, _, rest = owner.partition(":")
    pid_s, _, ticks = rest.partition(":")
    if host != _host_id() or not pid_s.isdigit():
        return False
    pid = int(pid_s)
    if ticks and os.path.isdir("/proc"):
        return _start_ticks(pid) != ticks
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
