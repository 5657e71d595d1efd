"""A call's allowance: a call stopped once it has run longer than its result could matter.

Two calls are bounded: a candidate's first call (a cold compile, Triton's autotuning), stopped
where the rest of it could no longer pay back (`execute.runner`; the rule says how long:
`measure.contest`), and a screen's run, stopped once it is past twice the screen's drop line
(`measure.timing`): either way the candidate is out, and the rest of the call would only have
said by how much. The allowance stops the call in the main thread with SIGALRM from the
process's timer (`setitimer`), between two Python steps: no thread is started or woken for a
call (one started for each call slows the calls it bounds). Part of a first call runs
elsewhere: on a GPU, autograd runs the backward on its device thread while the main thread
waits in C++, where no signal handler runs until the whole backward (two of the three kernels
Triton autotunes) has returned. Code there asks `checkpoint()` between its costly steps (the
Triton kernels' autotuner asks before each config it compiles and times), so the stop is raised
in whichever thread meets it first, once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

__all__ = ["Allowance", "OverAllowance", "checkpoint", "over_allowance", "stop_after"]


class OverAllowance(Exception):
    """A call ran past its allowance: stopped where it was."""


def over_allowance(e: BaseException) -> bool:
    """Whether `e` is the allowance's stop, as raised or as Dynamo or autograd wrapped it."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OverAllowance):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Allowance:
    """One allowance: what `stop_after` yields. Its state is live, then raised (its time is up
    and one thread has raised the stop) or ended (the call returned in time: `end`). Its time
    counts from `start` (from `stop_after`'s entry, unless it was entered not counting)."""

    def __init__(self, seconds: float | None = None) -> None:
        self._lock = threading.Lock()
        self.state = "live"
        self.seconds = seconds
        self.due: float | None = None  # on `time.monotonic`, once it counts

    def over(self) -> bool:
        """Whether its time is up and no thread has raised the stop: the caller raises it."""
        with self._lock:
            up = self.state == "live" and self.due is not None and time.monotonic() >= self.due
            if up:
                self.state = "raised"
            return up

    def start(self) -> None:
        """Its time counts from now (already counting: nothing)."""
        if self.due is None and self.seconds is not None:
            self.due = time.monotonic() + self.seconds
            _arm(self)

    def end(self) -> None:
        """The call returned: nothing is stopped after it. Raises `OverAllowance` where the call
        caught its stop and went on (Triton's interpreter, reading a kernel's source): it overran."""
        with self._lock:
            caught, self.state = self.state == "raised", "ended"
        if _running is self:
            _arm(None)  # no signal in what follows the call
        if caught:
            raise OverAllowance


_running: Allowance | None = None


def _arm(allowance: Allowance | None) -> None:
    """The process's timer set for `allowance`'s due time (none, or not counting: off). Linux
    gives its SIGALRM to the main thread unless that thread blocks it (another thread's system
    call would fail)."""
    due = None if allowance is None or allowance.state != "live" else allowance.due
    signal.setitimer(signal.ITIMER_REAL, 0.0 if due is None else max(due - time.monotonic(), 1e-6))


def checkpoint(*_: object, **__: object) -> None:
    """Raise `OverAllowance` where the running allowance's time is up and no thread has raised
    it yet; otherwise nothing. Any thread, any arguments (a Triton autotuner's pre_hook)."""
    running = _running
    if running is not None and running.over():
        raise OverAllowance


@contextlib.contextmanager
def stop_after(seconds: float | None, counting: bool = True) -> Iterator[Allowance]:
    """Within it a call that runs `seconds` is stopped (`OverAllowance`): in the main thread by
    SIGALRM, elsewhere at a `checkpoint()`. Its time counts from the entry, or with `counting`
    False from the yielded allowance's `start()` (a run timed from just before its start is then
    stopped only after it has run `seconds` of its own). `end()` ends it once the call has
    returned: nothing is stopped after it. Without an allowance, off the main thread or without
    a timer: nothing is bounded. An allowance within another holds the process's timer until
    it ends."""
    global _running
    if seconds is None or not hasattr(signal, "setitimer") or (
        threading.current_thread() is not threading.main_thread()
    ):
        yield Allowance()
        return
    running = Allowance(seconds)
    outer, _running = _running, running

    def over(signum: int, frame: object) -> None:
        if running.over():  # not a late signal, nor one of another allowance's
            raise OverAllowance

    old = signal.signal(signal.SIGALRM, over)
    try:
        if counting:
            running.start()
        yield running
    finally:
        with contextlib.suppress(OverAllowance):  # a stop raised here has done its work
            running.end()
        _running = outer  # its timer is off (`end`)
        signal.signal(signal.SIGALRM, old)
        _arm(outer)  # its time again, where it still counts
