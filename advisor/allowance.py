"""A call's allowance: a call stopped once it has run longer than its result could matter.

Two calls are bounded: a candidate's first call (a cold compile, Triton's autotuning), stopped
where the rest of it could no longer pay back (`execute.runner`; the rule says how long:
`measure.contest`), and a screen's run, stopped once it is past twice the screen's drop line
(`measure.timing`): either way the candidate is out, and the rest of the call would only have
said by how much. The allowance stops the call in the main thread with SIGALRM,
between two Python steps. Part of a first call runs elsewhere: on a GPU, autograd runs the
backward on its device thread while the main thread waits in C++, where no signal handler
runs until the whole backward (two of the three kernels Triton autotunes) has returned. Code
there asks `checkpoint()` between its costly steps (the Triton kernels' autotuner asks before
each config it compiles and times), so the stop is raised in whichever thread meets it first,
once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
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
    """One allowance: what `stop_after` yields. Its state is live, then spent (its time is up),
    raised (one thread has raised the stop) or ended (the call returned in time: `end`). Its
    time counts from `start` (from `stop_after`'s entry, unless it was entered not counting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = "live"
        self.counting = threading.Event()

    def move(self, old: str, new: str) -> bool:
        with self._lock:
            if self.state != old:
                return False
            self.state = new
            return True

    def start(self) -> None:
        """Its time counts from now (already counting: nothing)."""
        self.counting.set()

    def end(self) -> None:
        """The call returned: nothing is stopped after it. Raises `OverAllowance` where the call
        caught its stop and went on (Triton's interpreter, reading a kernel's source): it overran."""
        with self._lock:
            caught, self.state = self.state == "raised", "ended"
        if caught:
            raise OverAllowance


_running: Allowance | None = None


def checkpoint(*_: object, **__: object) -> None:
    """Raise `OverAllowance` where the running allowance is spent and no thread has raised it
    yet; otherwise nothing. Any thread, any arguments (a Triton autotuner's pre_hook)."""
    running = _running
    if running is not None and running.state == "spent" and running.move("spent", "raised"):
        raise OverAllowance


@contextlib.contextmanager
def stop_after(seconds: float | None, counting: bool = True) -> Iterator[Allowance]:
    """Within it a call that runs `seconds` is stopped (`OverAllowance`): in the main thread by
    SIGALRM, elsewhere at a `checkpoint()`. Its time counts from the entry, or with `counting`
    False from the yielded allowance's `start()` (a run timed from just before its start is then
    stopped only after it has run `seconds` of its own, however late the timer's thread began).
    `end()` ends it once the call has returned: nothing is stopped after it. Without an
    allowance, off the main thread or without SIGALRM: nothing is bounded."""
    global _running
    main = threading.main_thread()
    running = Allowance()
    if seconds is None or not hasattr(signal, "SIGALRM") or threading.current_thread() is not main:
        yield running
        return
    outer, _running = _running, running
    cancelled = threading.Event()

    def over(signum: int, frame: object) -> None:
        if running.move("spent", "raised"):
            raise OverAllowance

    def count() -> None:  # the signal to the main thread alone: another's system call would fail
        running.counting.wait()
        if not cancelled.wait(max(seconds, 1e-3)) and running.move("live", "spent"):
            signal.pthread_kill(main.ident or 0, signal.SIGALRM)

    if counting:
        running.start()
    old = signal.signal(signal.SIGALRM, over)
    timer = threading.Thread(target=count, daemon=True)
    try:
        timer.start()  # within: a stop that comes before the yield still restores the handler
        yield running
    finally:
        with contextlib.suppress(OverAllowance):  # a stop raised here has done its work
            running.end()
        _running = outer
        cancelled.set()
        running.start()  # a count never started ends too
        timer.join()  # no signal is sent once the old handler is back
        signal.signal(signal.SIGALRM, old)
