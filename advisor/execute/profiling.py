"""Opt-in cProfile of every advisor process: `ADVISOR_PROFILE_DIR=<dir>`.

Where the harness's seconds go (most of a quick run is outside the timed samples) needs every
process's profile from one run. With the variable set:

- the `advisor` command profiles itself from the package's first import (`start_early`, before
  torch's import), so the interpreter's own start is the only part it cannot see;
- the fork server (`children`) profiles its preload, torch's import included, and stops before
  its first fork, so no child inherits a running profiler;
- every child (`children.start_child`: workers, the probe's child, cudnn.benchmark's worker,
  the final check's fresh process) profiles its whole life, its target's return, `leave()` (the
  exit handlers) or a SIGTERM.

Each writes `<dir>/<role>-<pid>.prof` (pstats' format) and `<role>-<pid>.json`: the process's
age when its profile began (the start it could not profile), the seconds covered and how it
ended. `python -m benchmarks profile DIR` tables them. cProfile may miss other threads' work
(Python 3.11 records the thread that started it), and its overhead slows Python-heavy code:
read shares from a profile, not benchmark figures.

A parent ending a child with SIGKILL would lose its profile: `kill` sends SIGTERM first while
profiling, and the child's handler writes the profile, then dies of that SIGTERM as it would
unprofiled (a child ended in its first milliseconds, before its profile began, leaves none).
Without the variable nothing here imports cProfile, sets a handler or changes how a child ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["ENV", "GRACE_S", "end_of_preload", "kill", "on", "process_age_s", "profiled", "rename", "start",
           "start_early", "stop"]  # fmt: skip

ENV = "ADVISOR_PROFILE_DIR"
GRACE_S = 5.0  # a child's time to write its profile after SIGTERM, before SIGKILL

_state: dict[str, Any] = {}  # the running profile: profiler, role, start, meta, old handler


def on() -> bool:
    """Whether this process's advisor processes are profiled (`$ADVISOR_PROFILE_DIR` set)."""
    return bool(os.environ.get(ENV))


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that cannot be read.
    The `advisor` command counts its own start-up as the run's first process start
    (`advisor.stages.walltime`), and a profile records the age it began at."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return max(0.0, uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def start(role: str) -> bool:
    """Profile this process from now on as `role`; whether a profile started (not without the
    variable, nor when one runs already). It ends by `stop()`, at exit or at a SIGTERM."""
    if not on() or _state:
        return False
    import atexit
    import cProfile
    import signal
    import time

    age, began = process_age_s(), time.perf_counter()
    profiler = cProfile.Profile()
    try:
        profiler.enable()
    except ValueError as e:  # Python 3.12+: another profiling tool is active; the run goes on
        print(f"advisor: {role} not profiled: {e}", file=sys.stderr)
        return False
    _state.update(role=role, began=began, age=age, ended="exit", profiler=profiler)
    with contextlib.suppress(ValueError):  # not the main thread: no handler, the rest works
        _state["old_term"] = signal.signal(signal.SIGTERM, _on_sigterm)
    atexit.unregister(stop)  # one registration (a forked child inherits its server's list)
    atexit.register(stop)
    return True


def rename(role: str) -> None:
    """The running profile's role from now on (the probe's child that becomes a worker)."""
    if _state:
        _state["role"] = role


def stop() -> str | None:
    """End the running profile and write it (`<role>-<pid>.prof` and `.json`); its path, or
    None where none ran or it could not be written (said in one line on stderr)."""
    if not _state:
        return None
    import atexit
    import json
    import signal
    import time

    state = dict(_state)
    _state.clear()
    state["profiler"].disable()
    covered = time.perf_counter() - state["began"]
    atexit.unregister(stop)
    with contextlib.suppress(ValueError, TypeError):
        # A SIGTERM while the profile is written must not cut it short; the old handler after.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    folder = os.path.abspath(os.environ.get(ENV) or ".")
    base = os.path.join(folder, f"{state['role']}-{os.getpid()}")
    meta = {"role": state["role"], "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv,
            "age_at_start_s": state["age"], "covered_s": covered, "ended": state["ended"],
            "unix_time_at_end": time.time()}  # fmt: skip
    try:
        os.makedirs(folder, exist_ok=True)
        state["profiler"].dump_stats(base + ".prof.part")
        os.replace(base + ".prof.part", base + ".prof")
        with open(base + ".json.part", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(base + ".json.part", base + ".json")
    except OSError as e:
        print(f"advisor: profile of {state['role']} not written: {e}", file=sys.stderr)
        return None
    finally:
        if "old_term" in state:
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGTERM, state["old_term"])
    return base + ".prof"


def _on_sigterm(signum: int, frame: Any) -> None:
    """Write the profile, then die of the same signal, as the process would have without it
    (no SystemExit that code catching BaseException could swallow while its parent waits)."""
    import signal

    _state["ended"] = "SIGTERM"
    stop()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def profiled(role: str) -> Iterator[None]:
    """A child's life (`children.start_child`'s target) profiled as `role` while profiling: a
    forked child leaves by `os._exit`, which runs no exit handler, so it ends here."""
    started = start(role)
    try:
        yield
    finally:
        if started:
            stop()


def kill(proc: Any) -> None:
    """End a child process (a multiprocessing Process) by SIGKILL if it is alive. While
    profiling, a SIGTERM first and up to `GRACE_S` for it to write its profile."""
    if on() and proc.is_alive():
        proc.terminate()
        proc.join(GRACE_S)
    if proc.is_alive():
        proc.kill()


def _is_command(argv: list[str]) -> bool:
    """Whether this process is the `advisor` command (`advisor ...` or `python -m advisor`)."""
    return len(argv) > 1 and (argv[0] == "-m" or os.path.basename(argv[0]) == "advisor")


def _in_fork_server() -> bool:
    """Whether this import runs in multiprocessing's fork server, importing its preload."""
    frame: FrameType | None = sys._getframe()
    server = os.path.join("multiprocessing", "forkserver.py")
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_code.co_filename.endswith(server):
            return True
        frame = frame.f_back
    return False


def start_early() -> None:
    """The package's first call: with the variable set, the `advisor` command's profile (or the
    fork server's, whose preload imports the package first while profiling) starts here, before
    torch's import. Any other program that imports the advisor is not profiled."""
    if not on():
        return
    if _is_command(sys.argv):
        start("advisor")
    elif _in_fork_server():
        start("forkserver")


def end_of_preload() -> None:
    """The fork server's last preload import: its profile ends before it forks any child."""
    if _state.get("role") == "forkserver":
        _state["ended"] = "preload done"
        stop()
