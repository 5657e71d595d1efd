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
from advisor.measure.candidate import Candidate, Mode
from advisor.workload.build import Workload
from advisor.workload.deferred import DeferredWorkload
from advisor.workload.info import ModelFileInfo, parse_info

__all__ = ["ProbeChild", "hand_over", "load_then_serve", "probe_model", "user_failure"]


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
    step = (mode, device)
    proc, parent = start_child(load_then_serve, ("args", workload_args), step, role="probe")
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


def load_then_serve(
    conn: Connection,
    source: tuple[str, Any],
    step: tuple[Mode, str] | None,
    then: Callable[[Connection, Workload, Any], None] | None = None,
) -> None:
    """A child that runs the user's code first: load the workload from `source` (("args",
    make_workload's arguments) or ("info", its info's JSON)) and, with `step` (mode, device), one
    step of PyTorch's default; reply ("ok", and after a step its info and its parameters' dtype)
    or the failure, and wait. None ends it. With `then` (the final check's, which runs no step),
    the next message goes to `then` with the workload; else ("serve", ...) makes it the run's
    first worker."""
    become_child()
    import json

    from advisor.device.global_state import global_state
    from advisor.knobs import Settings
    from advisor.workload.args import make_workload
    from advisor.workload.rebuild import workload_from_info

    pristine = global_state()  # before any user code: what a worker's trials start from
    conn.send(("started",))
    workload: Any = None
    try:
        kind, what = source
        workload = make_workload(**what) if kind == "args" else workload_from_info(json.loads(what))
        reply: tuple[Any, ...] = ("ok",)  # the final check's: nothing more runs before it
        if step is not None:
            cand = Candidate(workload, Settings(), torch.device(step[1]), step[0])
            try:
                outputs = bool(cand.capture().outputs)
            finally:
                cand.close()
            dtype = str(workload.param_dtype).removeprefix("torch.")
            reply = ("ok", workload.info.model_dump(mode="json"), dtype)
            if not outputs:
                reply = ("error", "it returned no tensor: there is nothing to time or check")
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
    if msg is None:
        leave()  # closed unused: its parent waits for it
    if then is not None:
        then(conn, workload, msg)
        leave()  # the run waits for this process to end before it writes the advice
    if isinstance(msg, tuple) and msg[0] == "serve" and step is not None:
        del workload, cand  # the worker builds its own from the info it is sent
        rename("probe_worker")  # its profile, where there is one: the run's first worker
        worker_main(conn, msg[1], step[1], step[0], msg[2], pristine=pristine)
