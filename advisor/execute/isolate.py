"""Isolated trials: candidates run in a worker process with a time limit.

A crash (segfault, abort, CUDA illegal address), a hang (killed at the limit) or an out-of-memory
becomes a failed trial with its reason, and the worker is replaced where its state may be bad; the
study goes on. Workers are never forked from the parent (advisor.execute.children: spawned, or
forked from a server that only imported torch), so a parent that already initialised CUDA is safe.

Protocol over a pipe: the worker starts (imports, rebuilds the workload from its info's JSON,
computes the fp32 reference) and sends ("ready", pid) or ("error", reason); then for each
settings JSON it receives it sends ("result", TrialResult JSON). The time limit covers a
candidate's own evaluation only: start-up has its own, larger limit, so the first trial does not
pay for importing torch. Workers are started with stdout on stderr: whatever the user's code
prints there (at import, in its factories, in forward) never reaches a caller's stdout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import torch

from advisor.execute.children import start_child
from advisor.execute.gating import failed
from advisor.execute.profiling import kill
from advisor.execute.worker_process import LEAVE_S, worker_main
from advisor.gate.numeric import Gate
from advisor.knobs import Settings, precision_of
from advisor.measure.candidate import Mode
from advisor.measure.results import Failure, TrialResult
from advisor.measure.stats import Race
from advisor.measure.verdict import PrecisionCheck
from advisor.space import SearchSpace
from advisor.workload.info import WorkloadInfo

if TYPE_CHECKING:
    from advisor.workload.build import Workload


def receive(conn: Connection, proc: Any, timeout_s: float) -> Any:
    """A child's next message, 'timeout', or 'dead' when it died or closed the pipe."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if conn.poll(0.1):
            try:
                return conn.recv()
            except (EOFError, OSError):
                return "dead"
        if not proc.is_alive():
            # It may have sent its last message just before exiting.
            return conn.recv() if conn.poll(0) else "dead"
    return "timeout"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class RetimeFailed(RuntimeError):
    """The interleaved re-time of the finalists could not finish; the message says why."""


STARTUP_TIMEOUT_S = 300.0  # importing torch, building the workload and the fp32 reference


class IsolatedEvaluator:
    """Evaluates each candidate in a worker subprocess, replacing it after a crash or hang.

    `info` must be recreatable (`info.recreatable`): the worker rebuilds the workload from it."""

    def __init__(
        self,
        info: WorkloadInfo,
        device: torch.device,
        mode: Mode,
        space: SearchSpace,
        timeout_s: float = 600.0,
        cudnn_benchmark: bool = False,
        on_start: Callable[[float], None] | None = None,
    ) -> None:
        self.info, self.device, self.mode, self.space = info, device, mode, space
        self.cudnn_benchmark = cudnn_benchmark  # the value of every candidate it is given
        self._known: dict[str, str] = {}  # precision verdicts: own path's JSON -> check's JSON
        self.timeout_s = timeout_s
        self.startup_timeout_s = max(STARTUP_TIMEOUT_S, timeout_s)
        self._proc: Any = None
        self._conn: Connection | None = None
        self._switch = False  # the live worker must load `info` before its next task
        self._adopted = False  # the process is the probe's child, not serving yet
        self._pending = False  # launched, its "ready" not read yet
        self.starts = 0  # workers started so far (or adopted); > 1 means one was replaced
        # Told the seconds a task waited for a worker to start (interpreter, torch, the model's
        # load, the device's context): the run's Time line names them.
        self.on_start = on_start

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def adopt(self, proc: Any, conn: Connection) -> None:
        """Take a live process that waits for ("serve", ...) as the first worker: the probe's
        child (`advisor.execute.probe`), which has already imported torch and run the model
        once, so the run does not pay a second start-up. It is told what to serve at the first
        task (a run that finds everything stored measures nothing); if it cannot, it is ended
        and a fresh worker is started, which then says what went wrong."""
        self._kill()
        self._proc, self._conn, self._switch = proc, conn, False
        self._adopted = True

    def _readied(self, message: tuple[Any, ...]) -> bool:
        """Send the live process `message` (it loads a workload); whether it then says ready."""
        assert self._conn is not None
        try:
            self._conn.send(message)
            msg = self._receive(self.startup_timeout_s)
        except (BrokenPipeError, OSError):
            msg = "dead"
        return isinstance(msg, tuple) and msg[0] == "ready"

    def launch(self) -> None:
        """Start the worker now without waiting for it: it imports torch and builds the
        workload while this process goes on (opening the study, planning); the first task
        waits until it is ready. Nothing where a worker is already running or adopted."""
        if self._proc is None:
            self._spawn()
            self._pending = True

    def _live(self) -> str | None:
        """Make sure a worker is running on `info`: switch the live one to it, or start one.
        None, or why no worker could start."""
        if self._pending:
            self._pending = False
            why = self._waited(self._ready)
            if why is not None:
                return why
        if self._adopted and self._proc is not None and self._proc.is_alive():
            self._adopted = False  # it becomes this evaluator's worker, or is ended
            if self._readied(("serve", self.info.model_dump_json(), self.space.model_dump_json())):
                self.starts += 1
            else:
                self._kill()  # a fresh worker says what went wrong
        if self._switch and self._proc is not None and self._proc.is_alive():
            self._switch = False
            if not self._readied(("workload", self.info.model_dump_json())):
                self._kill()  # a fresh worker on the new workload says what went wrong
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            return self._waited(self._start)
        return None

    def _waited(self, start: Callable[[], str | None]) -> str | None:
        """`start()`, its wait told to `on_start`."""
        t0 = time.perf_counter()
        try:
            return start()
        finally:
            if self.on_start is not None:
                self.on_start(time.perf_counter() - t0)

    def _start(self) -> str | None:
        """Start a worker and wait until it is ready; None, or why it could not start."""
        self._spawn()
        return self._ready()

    def _spawn(self) -> None:
        self._switch = False
        # Started with stdout on stderr: whatever the user's code prints there (at import, in
        # build_model, in forward) stays off stdout.
        self._proc, self._conn = start_child(
            worker_main,
            self.info.model_dump_json(),  # the same JSON a config file holds
            str(self.device),
            self.mode,
            self.space.model_dump_json(),
            None,
            self.cudnn_benchmark,
            role="benchmark_worker" if self.cudnn_benchmark else "worker",
        )
        self.starts += 1

    def _ready(self) -> str | None:
        """Wait for the spawned worker's "ready"; None, or why it could not start."""
        msg = self._receive(self.startup_timeout_s)
        if isinstance(msg, tuple) and msg[0] == "ready":
            return None
        if isinstance(msg, tuple) and msg[0] == "error":
            why = f"worker failed to start: {msg[1]}"
        elif msg == "timeout":
            why = f"worker did not start within {self.startup_timeout_s:g} s"
        else:
            why = f"worker failed to start: {self._exit_reason()}"
        self._kill()
        return why

    def _receive(self, timeout_s: float) -> Any:
        assert self._conn is not None and self._proc is not None
        return receive(self._conn, self._proc, timeout_s)

    def _kill(self) -> None:
        if self._proc is not None:
            kill(self._proc)
            self._proc.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._adopted, self._pending = None, None, False, False

    def _failed(self, settings: Settings, reason: str, kind: Failure | None = None) -> TrialResult:
        return failed(settings, reason, precision_of(settings, self.device), kind)

    def __call__(
        self, settings: Settings, *, race: Race | None = None, time_left_s: float | None = None
    ) -> TrialResult:
        race_kw = dataclasses.asdict(race) if race is not None else None
        return self._task(("evaluate", settings.model_dump_json(), race_kw, time_left_s,
                           list(self._known.values())), settings)  # fmt: skip

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        """The gate's verdict on a candidate measured without it (`gating.gate_only`), in the
        worker, under the trial limit."""
        return self._task(("gate", settings.model_dump_json(), None, time_left_s,
                           list(self._known.values())), settings)  # fmt: skip

    def _task(self, message: tuple[Any, ...], settings: Settings) -> TrialResult:
        """Send a live worker (one that cannot start fails the candidate) one candidate's task
        and wait for its result, within the trial limit (twice that where its precision is still
        to be judged)."""
        why = self._live()
        if why is not None:
            return self._failed(settings, why, "start")
        assert self._conn is not None
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            return self._crashed(settings)
        # A precision not judged yet on this model is judged in this trial (a short training
        # run: advisor.gate.precision): it gets a second trial limit.
        own = Gate.own_path(settings).model_dump_json()
        judged = precision_of(settings, self.device) == "fp32" or own in self._known
        limit = self.timeout_s * (1 if judged else 2)
        msg = self._receive(limit)
        if msg == "timeout":
            self._kill()
            return self._failed(settings, f"timed out after {limit:g} s (killed)", "timeout")
        if not (isinstance(msg, tuple) and msg[0] == "result"):
            return self._crashed(settings)
        result = TrialResult.model_validate_json(msg[1])
        stop = result.stop  # a compile stopped mid-way: its compiler's state (not autotuning's)
        interrupted = stop is not None and stop.kind == "cannot_pay" and stop.rival is None and (
            stop.one_off == "cold compile")
        if result.failure == "device":
            self._kill()  # its CUDA context may be poisoned: the next trial gets a fresh worker
        elif interrupted:
            # The next trial gets a fresh worker; this one is asked to leave, not killed: a
            # killed worker's semaphores (tqdm's lock, made by Inductor) outlive it, and the
            # resource tracker warns of them at the command's exit
            self.close()
        return result

    def know(self, checks: list[PrecisionCheck]) -> None:
        """Precision verdicts sent along with every later candidate (not measured again)."""
        for check in checks:
            self._known.setdefault(check.own_path.model_dump_json(), check.model_dump_json())

    def use(self, workload: Workload) -> None:
        """Evaluate another workload from now on, in the same worker when it is alive. The
        worker loads it at the next task, not before (a stage may find everything stored and
        measure nothing); one that cannot switch is replaced then, and the fresh one reports
        why. Switching back to the first workload reuses what the worker kept of it."""
        if workload.info != self.info:
            self.info = workload.info
            self._switch = self._proc is not None and not self._adopted  # else served as is

    def retime(
        self, results: list[TrialResult], *, time_left_s: float | None = None
    ) -> list[TrialResult]:
        """The finalists re-timed together, interleaved, in a worker (advisor.execute.retime).

        Raises RetimeFailed with the reason when the worker fails, crashes or runs out of time
        (the trial limit once per finalist)."""
        jsons = [r.model_dump_json() for r in results]
        msg = self.ask(("retime", jsons, time_left_s), self.timeout_s * len(results))
        if msg[0] == "retimed":
            return [TrialResult.model_validate_json(j) for j in msg[1]]
        if msg[0] == "retime_error":
            raise RetimeFailed(msg[1])
        why = self._exit_reason()
        self._kill()
        raise RetimeFailed(why)

    def ask(self, message: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        """Send the worker one message and return its reply; RetimeFailed with the reason when
        it cannot start, dies or does not answer within `timeout_s` (it is then ended)."""
        why = self._live()
        if why is not None:
            raise RetimeFailed(why)
        assert self._conn is not None
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            raise RetimeFailed(self._exit_reason()) from None
        msg = self._receive(timeout_s)
        if isinstance(msg, tuple):
            return msg
        why = (
            f"timed out after {timeout_s:g} s (killed)" if msg == "timeout" else self._exit_reason()
        )
        self._kill()
        raise RetimeFailed(why)

    def _exit_reason(self) -> str:
        proc = self._proc
        if proc is not None:
            proc.join(timeout=5)
        code = proc.exitcode if proc is not None else None
        if code is not None and code < 0:
            why = f"worker crashed ({signal_name(-code)})"
            if -code == signal.SIGKILL:
                why += ": killed, possibly by the out-of-memory killer"
            return why
        return f"worker exited with code {code}"

    def _crashed(self, settings: Settings) -> TrialResult:
        why = self._exit_reason()
        self._kill()
        return self._failed(settings, why, "crash")

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(None)
                self._proc.join(timeout=LEAVE_S)
        self._kill()
