"""Starting the advisor's child processes: workers, the probe's child, the final check's fresh
process.

A child must start from no state of its parent's. Spawning one (a new interpreter) gives that,
but each pays the interpreter's start and torch's import: seconds of CPU, more than a one-layer
quick advise measures. On Linux the children are therefore forked from
multiprocessing's fork server, a process started once that has only imported torch and the
advisor's child code: no tensor made, no thread pool, no CUDA context, so a child forked from it
is as fresh as a spawned one, less the import. The `advisor` command forks that server from
itself once its own imports are done (torch among them), instead of starting a new interpreter
that imports torch again beside it. Elsewhere, and where `ADVISOR_START_METHOD=spawn`, children
are spawned.

What a forked child would otherwise take from the server and not from its parent is passed with
it: the parent's environment at the child's start (applied before the child's own code runs)
and its stderr (the child's stdout and stderr, as `fd_stdout_to_stderr` gives a spawned child).
The working folder and `sys.path` come with every child's start already; the implementations
named in `$ADVISOR_PLUGINS` are imported as the parent's environment names them. A parent whose
environment differs from the server's in a variable read at torch's import (thread pools,
allocators, library paths) spawns that child instead.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import multiprocessing as mp
import os
import sys
import threading
from collections.abc import Callable
from multiprocessing import forkserver, reduction, util
from multiprocessing.connection import Connection
from typing import Any
from unittest import mock

from advisor.execute import profiling
from advisor.execute.streams import fd_stdout_to_stderr

__all__ = ["PRELOAD", "Fd", "changed_at_import", "start_child", "start_for_cli", "start_method",
           "start_server"]

# What the fork server imports once, so that no child imports it again: torch and the modules
# the children run (which import the rest; their backward given gradients imports no sympy:
# `measure.candidate.engine_grads`). Nothing here runs a torch op at import: a fork after
# OpenMP's threads started can hang the child's first parallel region.
PRELOAD = ["torch", "advisor.execute.worker_process", "advisor.execute.probe",
           "advisor.stages.final_check", "advisor.execute.preloaded"]  # fmt: skip
# Variables read when torch (or the C libraries it loads) is imported: a child whose parent has
# other values than the server had must import torch itself, so it is spawned.
IMPORT_TIME_ENV = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "DNNL_", "ONEDNN_", "LD_",
                   "PYTHON", "TORCH_", "PYTORCH_", "CUDA_", "HIP_", "ROCR_", "ROCM_", "NVIDIA_",
                   "MALLOC_", "ATEN_", "KINETO_")  # fmt: skip
METHOD_ENV = "ADVISOR_START_METHOD"

_server_env: dict[str, str] | None = None  # the environment the running server started with


def _forks() -> bool:
    """Whether children are forked from the server here: Linux (macOS frameworks are not safe
    to fork without exec; Windows has no fork), unless the user asked for spawn."""
    return (
        sys.platform == "linux"
        and os.environ.get(METHOD_ENV, "forkserver") != "spawn"
        and "forkserver" in mp.get_all_start_methods()
    )


def start_server(fork: bool = False) -> None:
    """Start the fork server if it is not running: it imports `PRELOAD` while the caller goes
    on. With `fork` (the command, its own imports done: `start_for_cli`) the server is a fork of
    this process, so torch is imported once, not twice side by side (`_fork_here`); else, or
    where this process cannot be forked safely, a new interpreter. A server that died is
    started again, and its environment recorded again."""
    global _server_env
    if not _forks():
        return
    server: Any = forkserver._forkserver
    if _server_env is None:
        # Profiling: the package first, whose first call starts the server's profile before
        # torch's import (`profiling.start_early`).
        mp.set_forkserver_preload(["advisor", *PRELOAD] if profiling.on() else PRELOAD)
        # At exit the server is stopped and waited for, after multiprocessing has ended this
        # process's children (a negative priority runs last): a run leaves no process behind.
        util.Finalize(None, _stop_server, exitpriority=-10)
    before = getattr(server, "_forkserver_pid", None)
    if not (fork and before is None and _fork_here(server)):
        # The server's own output (a warning at import) must not reach our stdout: it may be JSON.
        with fd_stdout_to_stderr():
            server.ensure_running()
    if _server_env is None or getattr(server, "_forkserver_pid", None) != before:
        _server_env = dict(os.environ)


def _forkable() -> bool:
    """Whether this process can be the server's parent by a fork: one Python thread (a fork
    copies only the calling thread; a spawned server has OpenBLAS's pool as this process has,
    which re-forms after a fork), not profiled (the profile would run on in the server), and
    multiprocessing's server the one this module knows (`forkserver.main`'s arguments: Python
    3.14 adds an authentication key). Like `PRELOAD`, the command runs no torch op before."""
    params = list(inspect.signature(forkserver.main).parameters)
    return (
        params == ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]
        and threading.active_count() == 1
        and not profiling.on()
    )


def _fork_here(server: Any) -> bool:
    """Start `server` by `ForkServer.ensure_running` (its socket, and the pipe whose closing
    ends it), with a fork of this process in place of a new interpreter: what this process has
    imported, the server has; it imports the rest of `PRELOAD`. It keeps only the socket, the
    pipe and the standard streams (its stdout is this process's stderr), and leaves without
    this process's exit handlers. False where it cannot (`_forkable`): it is then spawned."""
    if not _forkable():
        return False
    spawn: Any = util.spawnv_passfds

    def fork(exe: str, args: list[str], passfds: list[int]) -> int:
        # `ensure_running` starts the resource tracker first: spawned, as multiprocessing does
        if "forkserver" not in args[-1]:
            return spawn(exe, args, passfds)
        pid = os.fork()
        if pid:
            return pid
        try:  # the server
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd > 2 and fd not in passfds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            os.dup2(2, 1)
            listener, alive = passfds
            gc.disable()  # until its preload is frozen (`preloaded`), as the package's import does
            forkserver.main(listener, alive, PRELOAD)
        finally:
            os._exit(0)

    with mock.patch.object(util, "spawnv_passfds", fork):
        server.ensure_running()
    return True


def _stop_server() -> None:
    with contextlib.suppress(Exception):
        forkserver._forkserver._stop()  # type: ignore[attr-defined]


def start_for_cli(args: list[str]) -> None:
    """The `advisor` command's arguments (`cli.run`, its imports done): where it will start
    children (`advise` or `worker`, isolated), their server is forked from it now, while it
    goes on to parse and plan."""
    if args[:1] in (["advise"], ["worker"]) and "--in-process" not in args:
        with contextlib.suppress(Exception):  # the children then start as they can, later
            start_server(fork=True)


def start_method(env: dict[str, str] | None = None) -> str:
    """How the next child, with environment `env` (default: this process's), starts:
    "forkserver", or "spawn" (not Linux, asked for, or `changed_at_import`)."""
    if not _forks():
        return "spawn"
    try:
        start_server()  # running already: a check that it still is
    except Exception:  # noqa: BLE001 - a server that cannot start: the child is spawned
        return "spawn"
    if _server_env is None or changed_at_import(dict(os.environ) if env is None else env):
        return "spawn"
    return "forkserver"


def changed_at_import(env: dict[str, str]) -> list[str]:
    """The variables read at torch's import whose value in `env` differs from the server's."""
    server = _server_env or {}
    return sorted(k for k in set(server) | set(env)
                  if k.startswith(IMPORT_TIME_ENV) and server.get(k) != env.get(k))  # fmt: skip


def context() -> Any:
    """The multiprocessing context the next child starts in (`start_method`)."""
    return mp.get_context(start_method())


class Fd:
    """A file descriptor passed to a child as it starts: the child's copy of it, by number."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        # DupFd hands the descriptor to the child through the start method's own channel; it
        # must be made while the child's start pickles its arguments.
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return int(dup.detach())


def _forked_main(target: Callable[..., None], role: str, env: dict[str, str], stderr: int,
                 *args: Any) -> None:  # fmt: skip
    """A forked child's first steps: its parent's stderr as stdout and stderr, its parent's
    environment; then `target(*args)`, profiled as `role` where its parent profiles. What the
    server imported comes frozen out of the garbage collector (`advisor.execute.preloaded`)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(stderr, 1)
    os.dup2(stderr, 2)
    os.close(stderr)
    os.environ.clear()
    os.environ.update(env)
    with profiling.profiled(role):
        from advisor.impls import load_plugins

        load_plugins()  # the parent's $ADVISOR_PLUGINS (the server imported its own at preload)
        target(*args)


def _spawned_main(target: Callable[..., None], role: str, *args: Any) -> None:
    """A spawned child's first step: what it imported to start (torch, the target's module)
    lives until it exits, so it is frozen out of the garbage collector. A full collection
    would otherwise walk those objects (torch alone makes hundreds of thousands) each time, and
    a compile's allocations bring many. Then `target(*args)`, profiled as `role` where its
    parent profiles."""
    gc.freeze()
    with profiling.profiled(role):
        target(*args)


def start_child(target: Callable[..., None], *args: Any,
                role: str = "child") -> tuple[Any, Connection]:  # fmt: skip
    """Start `target(conn, *args)` in a child process (daemonic: it dies with this one) and
    return (the process, this end of the pipe). The child's stdout goes to this process's
    stderr, and the caller's main script is not re-run in it. `role` names its profile
    (`advisor.execute.profiling`, with `$ADVISOR_PROFILE_DIR` set)."""
    from advisor.execute.worker_process import main_hidden

    ctx = context()
    parent, child = ctx.Pipe()
    if ctx.get_start_method() == "forkserver":
        proc: Any = ctx.Process(
            target=_forked_main,
            args=(target, role, dict(os.environ), Fd(2), child, *args),
            daemon=True,
        )
    else:
        proc = ctx.Process(target=_spawned_main, args=(target, role, child, *args), daemon=True)
    with main_hidden(), fd_stdout_to_stderr():
        proc.start()
    child.close()
    return proc, parent
