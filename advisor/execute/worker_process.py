"""The loop a worker process runs: start up (rebuild the workload from its info's JSON, compute
the fp32 references), then evaluate candidates, re-time finalists or serve a re-time's samples one
at a time, each from PyTorch's global state as it was, until told to stop. Spawned by
`advisor.execute.isolate.IsolatedEvaluator` (or entered by the probe's child that becomes a worker)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch

from advisor.device.global_state import global_state, restore_global_state
from advisor.device.ops import cuda_ops
from advisor.errors import first_line
from advisor.knobs import Settings
from advisor.measure.candidate import Mode
from advisor.measure.results import TrialResult
from advisor.measure.stats import Race
from advisor.measure.verdict import PrecisionCheck
from advisor.space import SearchSpace

__all__ = ["LEAVE_S", "die_with_parent", "leave", "main_hidden", "worker_main"]

# How long a parent waits for a child it told to end (or that ends by itself) before killing
# it: its exit handlers must run, or its named semaphores (tqdm's lock, which Inductor's compile
# progress makes) are left to the resource tracker, which warns after the run's last line.
LEAVE_S = 10.0


def die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when its parent dies (even by kill -9), so no orphan keeps
    the GPU busy while the study is resumed."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def become_child() -> None:
    """What every child the advisor spawns does first: Ctrl-C is the parent's to handle, the
    child dies with its parent, and the user's code prints as it likes but never on our stdout,
    which may be someone's JSON. (The parent starts children with stdout on stderr already, so
    prints at import time are covered too.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        os.dup2(2, 1)


def leave(code: int = 0) -> NoReturn:
    """End this process now with `code`, as a clean exit does, without the interpreter's
    teardown of every module and object: a child's parent waits for it before the next stage
    (a worker that compiled can take over a second to tear down), and the `advisor` command's
    user waits for the prompt. Exit handlers still run (temporary folders,
    multiprocessing's and logging's own), and the streams are flushed."""
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def main_hidden() -> Iterator[None]:
    """Spawn would re-run the caller's main script in the worker (a training script run twice,
    or an error without an `if __name__ == "__main__"` guard). The worker needs nothing from it:
    hide it while the process starts."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main and k in main.__dict__}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def worker_main(
    conn: Connection,
    info_json: str,
    device: str,
    mode: Mode,
    space_json: str,
    pristine: dict[str, Any] | None = None,
    cudnn_benchmark: bool = False,
) -> None:
    """Worker loop: start up, then receive ("evaluate", settings JSON, ...) and send back a
    TrialResult (JSON), or ("gate", ...) and send back the gate's verdict on a candidate measured
    without it; or receive ("retime", [TrialResult JSON, ...]) and send back the finalists
    re-timed together; or serve one re-time's samples one at a time ("retime_open",
    "retime_sample", ...); or ("prime", twins) to take cudnn.benchmark's first calls first; or
    ("workload", info JSON) to evaluate another workload from now on.

    `pristine`: the global state to start every trial from, when this process ran user code
    before it became a worker (the probe's child); by default, the state found here at start.
    `cudnn_benchmark`: the value this process's candidates have (its references run with it)."""
    become_child()
    from advisor.execute.evaluators import InProcessEvaluator
    from advisor.execute.first_calls import prime, with_first_calls
    from advisor.execute.gating import failed
    from advisor.execute.retime import RetimeSession
    from advisor.workload.rebuild import workload_from_info

    pristine = pristine if pristine is not None else global_state()
    try:
        dev = torch.device(device)
        if dev.type == "cuda":
            # Events, streams and Triton launches use the current device: make it this one.
            # (`set_device` needs an index: a bare "cuda", what --device cuda and auto give,
            # is the current device.)
            cuda_ops().make_current(dev)
        space = SearchSpace.model_validate_json(space_json)
        home = workload_from_info(json.loads(info_json))
        restore_global_state(pristine)  # the references too start from it, as the trials do
        # This process's candidates, as `InProcessEvaluator` runs them. It keeps the first
        # workload (the model) and its references: the per-layer stage switches to its layer
        # groups and back, and coming back must not rebuild them.
        ev = InProcessEvaluator(home, dev, mode, space, cudnn_benchmark=cudnn_benchmark)
        ev.the_gate()  # its references, before the parent is told the worker is ready
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", first_line(e)))
        return
    restore_global_state(pristine)
    session: Any = None  # a re-time served one sample at a time
    primed: dict[str, list[float]] = {}  # first calls taken before anything else (`prime`)
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            leave()
        if isinstance(msg, tuple) and msg[0] == "workload":
            # Another workload in the same process (the per-layer stage's layer groups): no new
            # interpreter, no new imports, only its references.
            try:
                ev.use(home if msg[1] == info_json else workload_from_info(json.loads(msg[1])))
                ev.the_gate()
                reply: tuple[str, Any] = ("ready", None)
            except Exception as e:  # noqa: BLE001 - reported to the parent as one line
                reply = ("error", first_line(e))
        elif isinstance(msg, tuple) and msg[0] == "retime":
            try:
                rs = [TrialResult.model_validate_json(j) for j in msg[1]]
                fresh = ev.retime(rs, time_left_s=msg[2])
                reply = ("retimed", [r.model_dump_json() for r in fresh])
            except Exception as e:  # noqa: BLE001 - e.g. the finalists do not fit together
                reply = ("retime_error", first_line(e))
        elif isinstance(msg, tuple) and msg[0].startswith("retime_"):
            # One re-time's samples, one at a time: the rounds are driven by the parent, which
            # interleaves them with another process's (`advisor.execute.benchmark_processes`).
            try:
                if msg[0] == "retime_open":
                    rs = [TrialResult.model_validate_json(j) for j in msg[1]]
                    policy = dataclasses.replace(space.timing.policy(), warmup_runs=msg[3])
                    session = RetimeSession(ev.workload, rs, dev, mode, policy, case=msg[2])
                    reply = ("opened", None)
                elif msg[0] == "retime_sample":
                    reply = ("sample", session.sample(msg[1]))
                    conn.send(reply)  # the global state stays as the sample left it: the
                    continue  # next sample puts it back itself
                else:
                    session.close()
                    reply = ("closed", None)
            except Exception as e:  # noqa: BLE001 - e.g. the finalists do not fit together
                reply = ("retime_error", first_line(e))
        elif isinstance(msg, tuple) and msg[0] == "prime":
            try:  # cudnn.benchmark's twins: their first calls before anything else runs here
                twins = [Settings.model_validate_json(j) for j in msg[1]]
                gate = ev.the_gate()
                primed.update(prime(ev.workload, twins, dev, mode, gate.seed))
                gate.cases.load()  # now: the twins' plans are searched, nothing else is alive
                reply = ("primed", None)
            except Exception as e:  # noqa: BLE001 - the twins' trials then say what fails
                reply = ("error", first_line(e))
        else:  # ("evaluate" or "gate", settings JSON, race, time left, verdicts known)
            kind, settings_json, race_kw, time_left_s, known = msg
            race = Race(**race_kw) if race_kw is not None else None
            settings = Settings.model_validate_json(settings_json)
            ev.know([PrecisionCheck.model_validate_json(j) for j in known])
            try:
                if kind == "gate":
                    result = ev.gate(settings, time_left_s=time_left_s)
                else:
                    result = ev(settings, race=race, time_left_s=time_left_s)
            except Exception as e:  # noqa: BLE001 - the reason, not "worker exited with code 1"
                result = failed(settings, first_line(e))
            if kind != "gate" and settings_json in primed:
                result = with_first_calls(result, primed.pop(settings_json))
            reply = ("result", result.model_dump_json())
        restore_global_state(pristine)  # the next trial starts from the same state
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
