"""The first run of the user's code, isolated and under a trial's time limit.

A model file is code the advisor does not control: importing it, calling its factories and
running one step may end the process (`sys.exit`, `os._exit`), hang, crash or raise. Before the
advise process runs any of it itself, a child process does all of it once (import, example inputs,
build, one step of the mode: in train mode with its backward) under the trial time limit; any
failure becomes one line (a `ModelFileError`: exit code 2) instead of a silent exit or a hang.
Start-up (importing torch in the child) has its own, larger limit, as a worker's does.

A child that passed can go on as the run's first worker (`keep=True`, then
`IsolatedEvaluator.adopt`): an interpreter and torch's import cost seconds, and the probe has
paid them already.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from advisor.errors import AdvisorError, ModelFileError, first_line
from advisor.execute.children import start_child
from advisor.execute.isolate import STARTUP_TIMEOUT_S, IsolatedEvaluator, receive, signal_name
from advisor.execute.profiling import kill, rename
from advisor.execute.worker_process import (
    LEAVE_S,
    become_child,
    leave,
    worker_main,
)
from advisor.workload.deferred import DeferredWorkload
from advisor.workload.info import ModelFileInfo, parse_info

__all__ = ["ProbeChild", "hand_over", "probe_model", "user_failure"]


@dataclass
class ProbeChild:
    """A probe's child that passed and waits: ("serve", info JSON, space JSON) makes it a worker
    (`IsolatedEvaluator.adopt`); `close()` ends it. `info` and `param_dtype`: the workload as the
    child loaded it (its description's JSON and its parameters' dtype), so the advise process
    can defer its own load (`advisor.workload.deferred`)."""

    proc: Any
    conn: Connection
    info: dict[str, Any] | None = None
    param_dtype: str | None = None

    def deferred(self, on_load: Callable[[float], None] | None = None) -> DeferredWorkload | None:
        """The workload the child loaded, to be loaded here only when a stage needs it: for a
        model file whose description came back (None otherwise: a layer loads quickly)."""
        if self.info is None or self.param_dtype is None:
            return None
        info = parse_info(self.info)
        if not isinstance(info, ModelFileInfo):
            return None
        return DeferredWorkload(info, getattr(torch, self.param_dtype), on_load)

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(None)
        self.proc.join(timeout=LEAVE_S)
        if self.proc.is_alive():
            kill(self.proc)
            self.proc.join(timeout=10)
        self.conn.close()


def hand_over(probed: ProbeChild | None, evaluator: object) -> None:
    """Give the probe's child to the run's evaluator: an isolated one adopts it as its first
    worker; any other has no use for it, and it is ended."""
    if probed is None:
        return
    # The probe ran PyTorch's default (cudnn.benchmark off): it serves that value's candidates.
    evaluator = getattr(evaluator, "off", evaluator)
    if isinstance(evaluator, IsolatedEvaluator):
        evaluator.adopt(probed.proc, probed.conn)
    else:
        probed.close()


def launch_worker(evaluator: object) -> None:
    """Start an isolated evaluator's first worker now (`IsolatedEvaluator.launch`), where no
    probe's child was handed over: its start-up overlaps this process's own."""
    evaluator = getattr(evaluator, "off", evaluator)
    if isinstance(evaluator, IsolatedEvaluator):
        evaluator.launch()


def probe_model(
    workload_args: dict[str, Any],
    mode: str,
    device: str,
    timeout_s: float,
    keep: bool = False,
) -> ProbeChild | None:
    """Load the model and run one step in a child process; raise a one-line error if that
    fails, exits, crashes or takes longer than `timeout_s`. With `keep`, the child that passed
    is returned, waiting to become a worker (the caller adopts or closes it), with the
    workload's description (`ProbeChild.deferred`)."""
    proc: Any
    proc, parent = start_child(_child, workload_args, mode, device, role="probe")
    what = f"the model's code (loading it and one {mode} step, in a separate process)"
    try:
        msg = receive(parent, proc, STARTUP_TIMEOUT_S)
        if msg == ("started",):
            msg = receive(parent, proc, timeout_s)
        if isinstance(msg, tuple) and msg and msg[0] == "ok":
            kept, proc = ProbeChild(proc, parent, *msg[1:]), None
            if not keep:
                kept.close()  # it leaves by its exit handlers, as a closed worker does
                return None
            return kept
        if isinstance(msg, tuple) and msg[0] == "advisor_error":
            raise ModelFileError(msg[1])
        if isinstance(msg, tuple) and msg[0] == "error":
            raise ModelFileError(f"{what} failed: {msg[1]}")
        if msg == "timeout":
            raise ModelFileError(f"{what} did not finish within {timeout_s:g} s: killed")
        proc.join(timeout=5)
        code = proc.exitcode
        if code is not None and code < 0:
            raise ModelFileError(f"{what} crashed ({signal_name(-code)})")
        raise ModelFileError(f"{what} ended the process (exit code {code})")
    finally:
        if proc is not None:
            kill(proc)
            proc.join(timeout=10)
            parent.close()


def user_failure(e: BaseException) -> str:
    """One line for a failure of the user's code: the exit it called, or its first line."""
    return f"it called sys.exit({e.code!r})" if isinstance(e, SystemExit) else first_line(e)


def _child(conn: Connection, workload_args: dict[str, Any], mode: str, device: str) -> None:
    become_child()
    import torch

    from advisor.device.global_state import global_state
    from advisor.knobs import Settings
    from advisor.measure.candidate import Candidate
    from advisor.workload.args import make_workload

    pristine = global_state()  # before any user code: what a worker's trials start from
    conn.send(("started",))
    try:
        workload = make_workload(**workload_args)
        cand = Candidate(workload, Settings(), torch.device(device), mode)  # type: ignore[arg-type]
        try:
            outputs = cand.capture().outputs
        finally:
            cand.close()
        info = workload.info.model_dump(mode="json")
        dtype = str(workload.param_dtype).removeprefix("torch.")
        del workload, cand
        reply: tuple[Any, ...] = ("ok", info, dtype)
        if not outputs:
            reply = ("error", "it returned no tensor: there is nothing to time or check")
        del outputs
    except AdvisorError as e:  # already one line naming the problem
        reply = ("advisor_error", str(e))
    except BaseException as e:  # noqa: BLE001 - the user's code: any failure is a bad input
        reply = ("error", user_failure(e))
    conn.send(reply)
    if reply[0] != "ok":
        return
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return
    if isinstance(msg, tuple) and msg[0] == "serve":
        rename("probe_worker")  # its profile, where there is one: the run's first worker
        worker_main(conn, msg[1], device, mode, msg[2], pristine=pristine)  # type: ignore[arg-type]
    elif msg is None:
        leave()  # closed unused: its parent waits for it
