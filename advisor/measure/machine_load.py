"""How much of the machine's CPU other processes used while we measured.

A load average counts the measuring process itself: on a 2-core machine its own 2 torch threads
read as a busy machine. Here the kernel's count of all non-idle CPU time (/proc/stat) is taken
over a span, minus what this process and its finished children used in it: what is left is
other processes' work. It matters because a busy CPU does not slow every candidate alike: with
every core taken, each of a step's parallel regions waits for a preempted thread, so steps with
more regions (a contiguous conv's layout reorders) lose most, and a ranking measured then need
not hold on a quiet machine (`advisor.stages.final_check` warns so).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["BUSY_SHARE", "CpuUsage", "busy_cpu_s", "busy_warning", "own_cpu_s"]

# Other processes' share of all CPU time above which a measurement is called busy (a tenth of
# the machine: about the share a light background job takes).
BUSY_SHARE = 0.1


def busy_cpu_s() -> float | None:
    """CPU seconds all processors spent not idle since boot (Linux), or None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: busy = all but idle, iowait and steal
    # (steal is another virtual machine's, not a process here)
    busy = sum(fields[:7]) - fields[3] - (fields[4] if len(fields) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds used by this process and every process it started: those that ended (and
    were waited for) and, on Linux, those still running (a worker, the compiler's helpers)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total + _live_descendants_cpu_s()


def _live_descendants_cpu_s() -> float:
    """CPU seconds of this process's running descendants, with the children they waited for
    (/proc/<pid>/stat: utime, stime, cutime, cstime); 0 where /proc cannot be read."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
        try:
            parents[pid] = int(fields[1])
            times[pid] = sum(int(v) for v in fields[11:15]) / tick
        except (IndexError, ValueError):
            continue
    ours, frontier = set(), [os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, pp in parents.items() if pp == parent and pid not in ours]
        ours.update(children)
        frontier += children
    return sum(times[pid] for pid in ours)


class CpuUsage:
    """Other processes' share of the machine's CPU time since this object was made. Read it
    after the subprocesses of the span have ended: until then their time counts as others'.
    The readers and the clock can be given (tests)."""

    def __init__(
        self,
        busy: Callable[[], float | None] = busy_cpu_s,
        own: Callable[[], float] = own_cpu_s,
        clock: Callable[[], float] = time.monotonic,
        cpus: int | None = None,
    ) -> None:
        self._busy, self._own, self._clock = busy, own, clock
        self.cpus = cpus or os.cpu_count() or 1
        self._start = (clock(), busy(), own())

    def others_share(self) -> float | None:
        """0.0 (nothing else ran) to 1.0 (other processes took every CPU); None where the
        kernel's count cannot be read."""
        wall0, busy0, own0 = self._start
        busy = self._busy()
        wall = self._clock() - wall0
        if busy is None or busy0 is None or wall <= 0:
            return None
        others = (busy - busy0) - (self._own() - own0)
        return min(1.0, max(0.0, others) / (wall * self.cpus))


def busy_warning(share: float | None, what: str = "tuning") -> str | None:
    """The warning for a result measured while other processes used `share` of the CPU."""
    if share is None or share <= BUSY_SHARE:
        return None
    return (
        f"other processes used {share:.0%} of the machine's CPU time while {what}: a busy CPU "
        "slows steps with more parallel regions most, so a ranking measured then may not hold "
        "on a quiet one"
    )
