"""Evaluators: what runs candidates. In this process (`InProcessEvaluator`) or in a worker
subprocess with a time limit (`advisor.execute.isolate.IsolatedEvaluator`); both satisfy `Evaluator`.
`new_evaluator` (advisor.execute.make_evaluator) chooses one for a run."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from advisor.device.global_state import global_state_kept
from advisor.execute.gating import gate_only
from advisor.execute.park import Park
from advisor.execute.retime import retime, retime_policy
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.candidate import Mode
from advisor.measure.results import TrialResult
from advisor.measure.stats import Race
from advisor.measure.verdict import PrecisionCheck
from advisor.space import SearchSpace
from advisor.workload.build import Workload

__all__ = ["Evaluator", "InProcessEvaluator", "Lent"]


class Evaluator(Protocol):
    """Measures and gates candidates of one workload; `close()` releases what it holds."""

    def __call__(
        self, settings: Settings, *, race: Race | None = None, time_left_s: float | None = None
    ) -> TrialResult: ...

    def retime(
        self, results: list[TrialResult], *, time_left_s: float | None = None
    ) -> list[TrialResult]: ...

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        """The gate's verdict on a candidate measured without it (`gating.gate_only`)."""
        ...

    def use(self, workload: Workload) -> None: ...

    def know(self, checks: list[PrecisionCheck]) -> None:
        """Precision verdicts measured elsewhere: not measured again (advisor.gate.precision)."""
        ...

    def close(self) -> None: ...


class InProcessEvaluator:
    """Evaluates candidates in this process, computing the gate's references once. Global state
    is put back after every candidate, so nothing leaks into the next one (or the caller)."""

    def __init__(self, workload: Workload, device: torch.device, mode: Mode, space: SearchSpace,
                 cudnn_benchmark: bool = False) -> None:
        self.workload, self.device, self.mode, self.space = workload, device, mode, space
        self.cudnn_benchmark = cudnn_benchmark  # the value its candidates have (`Gate`'s)
        self._gate: Gate | None = None
        self._home: Workload = workload  # the first workload: its references are kept
        self._home_gate: Gate | None = None
        self._known: list[PrecisionCheck] = []
        self._park = Park(device)  # screened candidates kept for their full timing

    def __call__(
        self, settings: Settings, *, race: Race | None = None, time_left_s: float | None = None
    ) -> TrialResult:

        with global_state_kept():
            return evaluate(self.workload, settings, self.device, self.mode, self.space,
                            self.the_gate(), race=race, time_left_s=time_left_s, park=self._park)  # fmt: skip

    def the_gate(self) -> Gate:
        """The workload's gate, built at its first use with the verdicts known so far."""
        if self._gate is None:
            self._gate = Gate(self.workload, self.device, self.mode, self.space,
                              cudnn_benchmark=self.cudnn_benchmark)
            self._gate.know(self._known)
        return self._gate

    def retime(
        self, results: list[TrialResult], *, time_left_s: float | None = None
    ) -> list[TrialResult]:
        """The finalists re-timed together, interleaved, in this process (advisor.execute.retime)."""
        self._park.clear()  # the screen's survivors were timed
        with global_state_kept():
            policy = retime_policy(self.space.timing.policy(), len(results), time_left_s)
            return retime(self.workload, results, self.device, self.mode, policy,
                          min_gain=self.space.min_gain)  # fmt: skip

    def gate(self, settings: Settings, *, time_left_s: float | None = None) -> TrialResult:
        """The gate's verdict on a candidate measured without it, in this process."""
        self._park.clear()  # asked once the candidates that could be picked were timed
        with global_state_kept():
            return gate_only(self.workload, settings, self.device, self.mode, self.the_gate(),
                             time_left_s)  # fmt: skip

    def use(self, workload: Workload) -> None:
        """Evaluate another workload from now on (its references are computed on first use;
        the first workload's are kept, for a stage that switches to layers and back)."""
        self._park.clear()
        if self.workload is self._home:
            self._home_gate = self._gate
        self.workload = workload
        self._gate = self._home_gate if workload is self._home else None

    def know(self, checks: list[PrecisionCheck]) -> None:
        self._known += [c for c in checks if c not in self._known]
        for gate in (self._gate, self._home_gate):
            if gate is not None:
                gate.know(checks)

    def close(self) -> None:
        self._park.clear()
        self._gate = self._home_gate = None


class Lent:
    """The run's evaluator, lent to a stage that closes what it is given (the per-layer stage):
    closing it switches it back to `home` instead of ending it, so one worker process serves
    every stage of a run (each start costs an interpreter, torch's import and the model's
    set-up)."""

    def __init__(self, evaluator: Evaluator, workload: Workload, home: Workload) -> None:
        self._evaluator, self._home = evaluator, home
        evaluator.use(workload)

    def __getattr__(self, name: str) -> Any:  # all but closing is the evaluator's own
        return getattr(self._evaluator, name)

    def __call__(
        self, settings: Settings, *, race: Race | None = None, time_left_s: float | None = None
    ) -> TrialResult:
        return self._evaluator(settings, race=race, time_left_s=time_left_s)

    def close(self) -> None:
        self._evaluator.use(self._home)
