"""The final check: does the recommendation hold where the user runs it?

The search and the re-times measure in a long-lived worker, on a machine whose load can change.
A busy CPU does not slow candidates alike: with every core taken, each parallel region of a
step waits for a preempted thread, so a step with more regions (a contiguous conv's layout
reorders) loses most. A layout can then measure far faster than the default with all torch
threads, with a narrow interval, and no faster at one thread: a win of waiting, not of
arithmetic, gone once the load changes. Such an estimate fails in a fresh process because of
the load, not because of the worker process.

So before a change is recommended, it is re-timed against PyTorch's default once more, after
everything else, where the user runs it: in a fresh process that loads the model file (or layer
spec) and builds both exactly as `advisor.apply` builds a model (`apply_settings`, `inputs`, the
training step of advisor.measure.candidate), interleaved, paired by round (`stats.paired_speedup`).
A workload no other process can rebuild (a live model) or an in-process run is checked in this
process, on fresh copies. The change is kept only when the paired interval lies above 1.0x; on a
busy CPU (other processes' share over `machine_load.BUSY_SHARE`) both are also timed at one torch
thread, and the change must win there too. Its time comes out of the run's budget
(`budget.budget_plan` reserves it); it always gets at least `MIN_ROUNDS` rounds. For a model file,
the fresh process is started beside the probe and loads the file while the probe does
(`FreshProcess`, a child of `execute.probe.load_then_serve` that runs no step): it runs nothing
else before the check, which then costs its timing only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import torch

from advisor.config import FinalCheck
from advisor.errors import first_line
from advisor.execute.isolate import receive
from advisor.execute.probe import load_then_serve
from advisor.execute.profiling import kill
from advisor.execute.retime import retime
from advisor.execute.worker_process import LEAVE_S
from advisor.knobs import Settings
from advisor.measure.candidate import Mode
from advisor.measure.machine_load import CpuUsage
from advisor.measure.results import TrialResult
from advisor.measure.stats import STRICT_Z, Measurement, paired_speedup
from advisor.measure.stopping import TimingPolicy
from advisor.workload.build import Workload

__all__ = ["CheckFailed", "FreshProcess", "check_policy", "final_check", "runner_up_check",
           "check_decided", "rounds_fit"]

STARTUP_S = 300.0  # a fresh interpreter, torch's import, the model file's (as a worker's start)
MIN_ROUNDS = 5  # the fewest a paired interval is computed from

log = logging.getLogger("advisor")


class CheckFailed(RuntimeError):
    """The final check could not be made; the message says why."""


def check_policy(policy: TimingPolicy, time_left_s: float | None) -> TimingPolicy:
    """The trials' policy for two finalists within what is left of the budget, with at least
    `MIN_ROUNDS` rounds however little is left, or however few samples the space allows a
    trial (a paired interval needs them: `stats.paired_speedup`)."""
    per = policy.max_time_s if time_left_s is None else max(0.05, time_left_s / 2)
    least = max(MIN_ROUNDS, min(policy.min_samples, MIN_ROUNDS + 2))
    return dataclasses.replace(
        policy,
        max_time_s=min(policy.max_time_s, per),
        min_samples=least,
        max_samples=max(policy.max_samples, least),
    )


def one_thread_pass(busy: bool, device: torch.device) -> bool:
    """Whether the check times its candidates again at one torch thread: on a busy CPU."""
    return busy and device.type == "cpu" and torch.get_num_threads() > 1


def rounds_fit(
    pair: list[TrialResult], policy: TimingPolicy, busy: bool, device: torch.device, left_s: float
) -> bool:
    """Whether the check's fewest rounds of `pair` (at their trials' medians, twice with the
    one-thread pass) fit the `left_s` seconds left of the budget: the rounds are paid anyway."""
    passes = 2 if one_thread_pass(busy, device) else 1
    return policy.min_samples * passes * sum(r.median_ms for r in pair) <= 1e3 * left_s


def holds(
    interval: tuple[float, float],
    one_thread: tuple[float, float, float] | None,
    min_gain: float,
) -> bool:
    """Whether a change's paired interval over the default holds: above 1.0x, reaching 1 +
    `min_gain` (a gain shown to be smaller than the search asked for is not worth a change),
    and at one thread (if busy) not slower."""
    lo, hi = interval
    return lo > 1.0 and hi >= 1.0 + min_gain and (one_thread is None or one_thread[1] > 1.0)


def check_decided(samples: list[list[float]], min_gain: float = 0.02) -> bool:
    """Whether the rounds so far (the default's, the pick's, then a runner-up's if any)
    decide the check: each change's paired interval over the default at `STRICT_Z` lies above
    1.0x with the usual one reaching 1 + `min_gain` (it holds), or wholly below 1 + `min_gain`
    (it fails); a runner-up cannot beat the pick by `min_gain`, or does as `runner_up_check`
    orders them (it is then recommended), at the strict interval. The 95% ones the check
    reports lie inside: the same verdicts, only wider than all the rounds' would be."""
    base, pick, *runner = samples
    if len(base) < MIN_ROUNDS:
        return False

    def strict(a: list[float], b: list[float]) -> tuple[float, float, float]:
        return paired_speedup(Measurement(samples_ms=a), Measurement(samples_ms=b), STRICT_Z)

    for change in (pick, *runner):
        _, lo, hi = strict(base, change)
        usual_hi = paired_speedup(Measurement(samples_ms=base), Measurement(samples_ms=change))[2]
        if not ((lo > 1.0 and usual_hi >= 1.0 + min_gain) or hi < 1.0 + min_gain):
            return False
    if runner:
        ratio, lo, hi = strict(pick, runner[0])
        return hi < 1.0 + min_gain or (lo > 1.0 and ratio >= 1.0 + min_gain)
    return True


def check_here(
    workload: Workload,
    pair: list[TrialResult],
    device: torch.device,
    mode: Mode,
    policy: TimingPolicy,
    busy: bool,
    where: str,
    min_gain: float = 0.02,
) -> FinalCheck:
    """The check, in this process: `pair` is the default and the recommendation, and may end
    with a runner-up (`runner_up_check` judges it), re-timed together, interleaved, on every
    shape. With one shape, the rounds stop once the verdicts are decided (`check_decided`); a
    shape set's rounds (summed round by round over the shapes) take the policy's full rounds."""
    usage = CpuUsage()
    rule = partial(check_decided, min_gain=min_gain)
    first_s = [0.0] * len(pair)  # each one's first call, seconds over the shapes
    measured = retime(workload, pair, device, mode, policy, decided=rule, first_s=first_s)
    ms = [r.measurement for r in measured]
    assert all(m is not None for m in ms)
    ratio, lo, hi = paired_speedup(ms[0], ms[1])  # type: ignore[arg-type]
    one: tuple[float, float, float] | None = None
    one_runner: tuple[float, float, float] | None = None
    ms1: list[Measurement | None] = []
    threads = torch.get_num_threads()
    if one_thread_pass(busy, device):
        torch.set_num_threads(1)
        try:
            again = retime(workload, pair, device, mode, policy, decided=rule)
        finally:
            torch.set_num_threads(threads)
        ms1 = [r.measurement for r in again]
        one = paired_speedup(ms1[0], ms1[1])  # type: ignore[arg-type]
        if len(ms1) > 2:
            one_runner = paired_speedup(ms1[0], ms1[2])  # type: ignore[arg-type]
    check = FinalCheck(
        where=where,
        speedup=ratio,
        speedup_ci=(lo, hi),
        rounds=len(ms[0].samples_ms),  # type: ignore[union-attr]
        held=holds((lo, hi), one, min_gain),
        one_thread=one,
        first_call_s=first_s[1],
        other_load=usage.others_share(),
        measured=[(m.reps, m.samples_ms) for m in (*ms, *ms1) if m is not None],
    )
    if len(pair) > 2:
        check = runner_up_check(check, pair[2].settings, ms, one_runner, min_gain)
        check = check.model_copy(update={"runner_up_first_call_s": first_s[2]})
    return check


def runner_up_check(
    check: FinalCheck,
    runner_up: Settings,
    ms: list[Measurement | None],
    one_thread: tuple[float, float, float] | None,
    min_gain: float,
) -> FinalCheck:
    """`check` with the runner-up's figures: over the default, and over the recommendation,
    paired by round; which of the two this machine tells faster beyond noise (by `min_gain`)."""
    base, pick, runner = ms
    assert base is not None and pick is not None and runner is not None
    r_ratio, r_lo, r_hi = paired_speedup(base, runner)
    v_ratio, v_lo, v_hi = paired_speedup(pick, runner)
    held = holds((r_lo, r_hi), one_thread, min_gain)
    if held and v_lo > 1.0 and v_ratio >= 1 + min_gain:
        order = "runner-up"
    elif v_hi < 1.0 and 1 / v_ratio >= 1 + min_gain:
        order = "pick"
    else:
        order = "undecided"
    return check.model_copy(
        update={
            "runner_up": runner_up,
            "runner_up_speedup": (r_ratio, r_lo, r_hi),
            "runner_up_held": held,
            "versus_runner_up": (v_ratio, v_lo, v_hi),
            "order": order,
        }
    )


def final_check(
    workload: Workload,
    device: torch.device,
    mode: Mode,
    policy: TimingPolicy,
    baseline: TrialResult,
    winner: TrialResult,
    *,
    fresh: bool,
    busy: bool,
    timeout_s: float,
    spare: FreshProcess | None = None,
    runner_up: TrialResult | None = None,
    min_gain: float = 0.02,
    on_start: Callable[[float], None] | None = None,
) -> FinalCheck:
    """The check of `winner` against `baseline` (see the module's docstring): in a fresh process
    when `fresh` (the workload must be recreatable; `spare`, a `FreshProcess` started early
    that loaded it, when there is one; else one started now, its wait told to `on_start`), else
    here. Raises CheckFailed with the reason when it cannot be made (a process that fails,
    crashes or takes over `timeout_s`); a `runner_up` is timed beside both."""
    pair = [baseline, winner] + ([runner_up] if runner_up is not None else [])
    if not fresh:
        try:
            return check_here(workload, pair, device, mode, policy, busy, "this process",
                              min_gain)  # fmt: skip
        except (RuntimeError, torch.OutOfMemoryError) as e:
            raise CheckFailed(first_line(e, with_type=False)) from None
    info = workload.info.model_dump_json()
    proc = spare if spare is not None and spare.ready(0.0) is None else None
    if proc is None:
        t0 = time.perf_counter()
        proc = FreshProcess(("info", info))
        why = proc.ready(STARTUP_S)
        if on_start is not None:
            on_start(time.perf_counter() - t0)
        if why is not None:
            proc.close()
            raise CheckFailed(why)
    try:
        return proc.check(info, device, mode, pair, policy, busy, timeout_s, min_gain)
    finally:
        proc.close()


class FreshProcess:
    """A fresh process for the final check: it loads the workload (a model file: its import,
    its factories, one forward, as `advisor.apply`'s user's script does) and waits for the
    check, running nothing else.

    Started early, beside the probe (`service.run_advise`), it loads the model file while the
    probe's child does: the check then pays neither an interpreter, torch's import nor the
    model file's (a library such as MONAI takes seconds to import), only its own timing. Nothing
    is timed while it loads: the run waits until it is ready (`ready`) before the first trial.
    `source` is ("args", make_workload's arguments) or ("info", a workload info's JSON)."""

    def __init__(self, source: tuple[str, Any]) -> None:
        from advisor.execute.children import start_child

        self.proc: Any
        child = start_child(load_then_serve, source, None, _check, role="final_check")
        self.proc, self.conn = child
        self._state: str | None = "loading"  # None: ready; else why not ("loading" meanwhile)

    def ready(self, timeout_s: float) -> str | None:
        """None once the process has loaded the workload (waiting up to `timeout_s` for it);
        else why it is not ready ("loading" while it still is)."""
        if self._state == "loading":
            if not self.proc.is_alive() and not self.conn.poll(0):
                self._state = f"its process ended while loading (exit code {self.proc.exitcode})"
            elif timeout_s > 0 or self.conn.poll(0):
                until = time.monotonic() + timeout_s
                msg = receive(self.conn, self.proc, timeout_s)
                if msg == ("started",):  # its interpreter is up: the load comes next
                    msg = receive(self.conn, self.proc, until - time.monotonic())
                if isinstance(msg, tuple) and msg[0] == "ok":
                    self._state = None
                elif isinstance(msg, tuple) and msg[0] in ("error", "advisor_error"):
                    self._state = f"loading the workload failed: {msg[1]}"
                elif msg == "dead":
                    self._state = f"its process ended while loading (exit code {self._code()})"
                elif msg != "timeout":
                    self._state = f"unexpected message {msg!r}"
                elif timeout_s >= STARTUP_S:
                    self._state = f"loading did not finish within {timeout_s:g} s (killed)"
        return self._state

    def check(
        self,
        info_json: str,
        device: torch.device,
        mode: Mode,
        pair: list[TrialResult],
        policy: TimingPolicy,
        busy: bool,
        timeout_s: float,
        min_gain: float = 0.02,
    ) -> FinalCheck:
        """The check in this process (which must be ready); CheckFailed with the reason."""
        job = ("check", info_json, str(device), mode, [r.model_dump_json() for r in pair],
               dataclasses.asdict(policy), busy, min_gain)  # fmt: skip
        try:
            self.conn.send(job)
        except (OSError, BrokenPipeError):
            raise CheckFailed(f"its process ended (exit code {self._code()})") from None
        msg = receive(self.conn, self.proc, STARTUP_S + timeout_s)
        self._state = "used" if isinstance(msg, tuple) else "busy"  # "used": it leaves itself
        if isinstance(msg, tuple) and msg[0] == "checked":
            return FinalCheck.model_validate_json(msg[1])
        if isinstance(msg, tuple) and msg[0] == "error":
            raise CheckFailed(msg[1])
        if msg == "timeout":
            raise CheckFailed(f"did not finish within {STARTUP_S + timeout_s:g} s (killed)")
        raise CheckFailed(f"its process ended (exit code {self._code()})")

    def close(self) -> None:
        """End the process: told to when it waits, waited for when it made its check (it then
        leaves by itself, `leave`), killed when it is still busy (a load that hangs in the
        user's code) or does not end in time. A process killed before its exit handlers ran
        leaves its named semaphores (the lock of tqdm, which Inductor's compile progress makes)
        to the resource tracker, which warns of them after the run's last line."""
        if self._state is None:
            with contextlib.suppress(OSError, BrokenPipeError):
                self.conn.send(None)
        if self._state in (None, "used"):
            self.proc.join(timeout=LEAVE_S)
        kill(self.proc)  # SIGTERM first while profiling: its profile is written
        self.proc.join(timeout=10)
        self.conn.close()
        self._state = "closed"

    def _code(self) -> int | None:
        self.proc.join(timeout=5)
        return self.proc.exitcode


def _check(conn: Connection, workload: Workload, msg: Any) -> None:
    """The fresh process's check (`execute.probe.load_then_serve` loaded `workload`): both
    built as `advisor.apply` builds them, then checked; the reply is the check or its failure."""
    from advisor.device.ops import cuda_ops
    from advisor.workload.rebuild import workload_from_info

    _, info_json, device, mode, pair_json, policy, busy, min_gain = msg
    try:
        if workload.info.model_dump_json() != info_json:  # loaded from other arguments
            workload = workload_from_info(json.loads(info_json))
        dev = torch.device(device)
        if dev.type == "cuda":
            cuda_ops().make_current(dev)
        pair = [TrialResult.model_validate_json(j) for j in pair_json]
        check = check_here(workload, pair, dev, mode, TimingPolicy(**policy), busy,
                           "fresh process", min_gain)  # fmt: skip
        conn.send(("checked", check.model_dump_json()))
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", first_line(e)))
