"""`cudnn.benchmark` measured in a process of its own.

cuDNN keeps its plans in a cache that lives as long as the process, keyed without the benchmark
flag, and it caches the plan its heuristics chose too. So a `cudnn_benchmark=True` candidate
measured in a process that already ran the same convolutions with the flag off reuses those plans
and never benchmarks; in the other order, PyTorch's default is timed with benchmarked plans. So on
CUDA, candidates go to a process per `cudnn_benchmark` value: the run's own evaluator takes
`False` (PyTorch's default), a worker of its own takes `True`. Finalists of both kinds are
re-timed in rounds driven from here, each sample taken by the process that holds its finalist,
so the pairing of the pick survives; the rounds stop where the pick is decided, as in one
process (`retime.stop_rule`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from advisor.device.global_state import global_state, restore_global_state
from advisor.execute.evaluators import Evaluator, InProcessEvaluator
from advisor.execute.isolate import IsolatedEvaluator, RetimeFailed
from advisor.execute.retime import RetimeSession, retime_policy, retimed_results, rounds, stop_rule
from advisor.knobs import Settings, precision_of
from advisor.measure.candidate import Mode
from advisor.measure.results import TrialResult
from advisor.measure.stats import Race
from advisor.measure.timing import interleave
from advisor.measure.verdict import PrecisionCheck
from advisor.space import SearchSpace
from advisor.workload.build import Workload

__all__ = ["BenchmarkSplit", "needs_split", "split_by_benchmark"]


def needs_split(device: torch.device, space: SearchSpace) -> bool:
    """Whether candidates with both `cudnn_benchmark` values can meet in this run."""
    return device.type == "cuda" and len(set(space.knobs.get("cudnn_benchmark", [False]))) > 1


class _WorkerSession:
    """A re-time session held by a worker process (`IsolatedEvaluator`)."""

    def __init__(self, ev: IsolatedEvaluator, results: list[TrialResult], case: int, warmup: int):
        self._ev = ev
        self._limit = ev.timeout_s
        reply = ev.ask(("retime_open", [r.model_dump_json() for r in results], case, warmup),
                       self._limit * max(1, len(results)))  # fmt: skip
        _expect(reply, "opened")

    def sample(self, i: int) -> float:
        return float(_expect(self._ev.ask(("retime_sample", i), self._limit), "sample"))

    def close(self) -> None:
        _expect(self._ev.ask(("retime_close",), self._limit), "closed")


def _expect(reply: tuple[Any, ...], kind: str) -> Any:
    if reply[0] != kind:
        raise RetimeFailed(str(reply[1]) if reply[0] == "retime_error" else f"{reply[0]!r}")
    return reply[1]


class _LocalSession(RetimeSession):
    """A re-time session in this process: PyTorch's global state is put back when it closes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._saved = global_state()
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            restore_global_state(self._saved)


# One re-time's finalists in one process, sampled one at a time: held here or by a worker.
Session = RetimeSession | _WorkerSession


class _Unmeasurable:
    """Where `cudnn_benchmark=True` cannot get a process of its own: a live model object, which
    a worker cannot rebuild. Its candidates fail with the reason instead of being mismeasured."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(
        self, settings: Settings, *, race: Race | None = None, time_left_s: float | None = None
    ) -> TrialResult:
        return TrialResult(
            settings=settings,
            status="failed",
            reason="cudnn.benchmark=True is measured in a process of its own (cuDNN's plan cache "
            "outlives a candidate and ignores the flag); a live model cannot be rebuilt in one: "
            "pass model_file= to measure it",
            precision=precision_of(settings, self.device),
        )

    def retime(self, results: list[TrialResult], **_: Any) -> list[TrialResult]:
        raise RetimeFailed("cudnn.benchmark=True cannot be measured for a live model")

    def gate(self, settings: Settings, **_: Any) -> TrialResult:
        return self(settings)

    def use(self, workload: Workload) -> None:
        pass

    def know(self, checks: list[PrecisionCheck]) -> None:
        pass

    def close(self) -> None:
        pass


class BenchmarkSplit:
    """An `Evaluator` over two processes, one per `cudnn_benchmark` value: `off` (the run's own
    evaluator) and `on` (made at its first candidate by `make_on`)."""

    def __init__(
        self,
        off: Evaluator,
        make_on: Callable[[Workload], Evaluator],
        workload: Workload,
        space: SearchSpace,
    ) -> None:
        self.off = off
        self._make_on = make_on
        self._on: Evaluator | None = None
        self._known: list[PrecisionCheck] = []
        self.workload, self.space = workload, space

    def _for(self, benchmark: bool) -> Evaluator:
        if not benchmark:
            return self.off
        if self._on is None:
            self._on = self._make_on(self.workload)
            self._on.know(self._known)
        return self._on

    def __call__(
        self, settings: Settings, *, race: Race | None = None, time_left_s: float | None = None
    ) -> TrialResult:
        return self._for(settings.cudnn_benchmark)(settings, race=race, time_left_s=time_left_s)

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        return self._for(settings.cudnn_benchmark).gate(settings, time_left_s=time_left_s)

    def launch_on(self) -> None:
        """Start the flag's process now without waiting for it (`IsolatedEvaluator.launch`): it
        imports and builds the model while the search runs in the other one, so the twins do
        not wait for it. It runs nothing on the GPU until its first task."""
        ev = self._for(True)
        if isinstance(ev, IsolatedEvaluator):
            ev.launch()

    def prime(self, twins: list[Settings]) -> str | None:
        """The flag's process runs each twin's first call, in order, before anything else
        (`advisor.execute.first_calls`); None, or why it could not (the twins' trials then
        take their own first calls)."""
        ev = self._for(True)
        if not isinstance(ev, IsolatedEvaluator):
            return f"no process of its own ({type(ev).__name__})"
        try:
            reply = ev.ask(("prime", [t.model_dump_json() for t in twins]),
                           ev.timeout_s * max(1, len(twins)))  # fmt: skip
        except RetimeFailed as e:
            return str(e)
        return None if reply[0] == "primed" else str(reply[1])

    def retime(
        self, results: list[TrialResult], *, time_left_s: float | None = None
    ) -> list[TrialResult]:
        kinds = {r.settings.cudnn_benchmark for r in results}
        if len(kinds) == 1:
            return self._for(kinds.pop()).retime(results, time_left_s=time_left_s)
        policy = retime_policy(self.space.timing.policy(), len(results), time_left_s)
        groups = {k: [i for i, r in enumerate(results) if r.settings.cudnn_benchmark == k]
                  for k in (False, True)}  # fmt: skip
        one_shape = len(self.workload.shape_cases) == 1
        per_case, rule = [], stop_rule(results, self.space.min_gain) if one_shape else None
        for case in range(len(self.workload.shape_weights)):
            sessions: dict[bool, Session] = {}
            try:
                for k, idx in groups.items():
                    sessions[k] = self._open(self._for(k), [results[i] for i in idx], case,
                                             policy.warmup_runs)  # fmt: skip
                where = {i: (k, pos) for k, idx in groups.items() for pos, i in enumerate(idx)}
                samplers = [partial(sessions[where[i][0]].sample, where[i][1])
                            for i in range(len(results))]  # fmt: skip
                per_case.append(interleave(samplers, time.perf_counter, **rounds(policy),
                                           decided=rule))  # fmt: skip
            except BaseException:
                # the first failure is the one to tell, Ctrl-C too: a worker asked to close
                # while its reply to a sample is unread answers with that reply instead
                for s in sessions.values():
                    with contextlib.suppress(Exception):
                        s.close()
                raise
            for s in sessions.values():
                s.close()
        return retimed_results(self.workload, results, per_case)

    def _open(self, ev: Evaluator, results: list[TrialResult], case: int, warmup: int) -> Session:
        if isinstance(ev, IsolatedEvaluator):
            return _WorkerSession(ev, results, case, warmup)
        if isinstance(ev, InProcessEvaluator):
            policy = dataclasses.replace(ev.space.timing.policy(), warmup_runs=warmup)
            return _LocalSession(ev.workload, results, ev.device, ev.mode, policy, case)
        raise RetimeFailed(f"cannot re-time interleaved with {type(ev).__name__}")

    def use(self, workload: Workload) -> None:
        self.workload = workload
        self.off.use(workload)
        if self._on is not None:
            self._on.use(workload)

    def know(self, checks: list[PrecisionCheck]) -> None:
        self._known += checks
        self.off.know(checks)
        if self._on is not None:
            self._on.know(checks)

    def close(self) -> None:
        try:
            self.off.close()
        finally:
            if self._on is not None:
                self._on.close()


def split_by_benchmark(
    off: Evaluator,
    workload: Workload,
    device: torch.device,
    space: SearchSpace,
    mode: Mode,
    timeout_s: float,
    on_start: Callable[[float], None] | None = None,
) -> BenchmarkSplit:
    """`off` for PyTorch's default value, a worker process of its own for `cudnn_benchmark=True`
    (or, for a live model that no worker can rebuild, a refusal that says so)."""

    def make_on(current: Workload) -> Evaluator:
        if not current.info.recreatable:
            return _Unmeasurable(device)
        return IsolatedEvaluator(current.info, device, mode, space, timeout_s,
                                 cudnn_benchmark=True, on_start=on_start)  # fmt: skip

    return BenchmarkSplit(off, make_on, workload, space)
