"""What a search is asked (`SearchOptions`) and what it returns (`SearchOutcome`, `Progress`,
`WorkSummary`). No optuna here: the service and the CLI read these."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from advisor.device.environment import Environment
from advisor.errors import AdvisorError
from advisor.measure.candidate import Mode
from advisor.measure.results import TrialResult
from advisor.search.ledger import Ledger, Stage
from advisor.search.shared_checks import SharedChecks
from advisor.space import Dropped


class CandidateFailed(Exception):
    """Raised inside the objective so optuna records the trial as FAIL; the reason is an attr."""


@dataclass(frozen=True)
class Progress:
    """What the progress display is told as a stage goes: candidates done of `total`, the best
    accepted time so far, the last result and the seconds since the stage began."""

    done: int
    total: int
    best_ms: float | None
    last: TrialResult | None
    elapsed_s: float
    stage: str = "global knobs"
    ended_s: float | None = None  # a span of the stage ended: its time (`elapsed_s`: the stage's)


@dataclass
class SearchOptions:
    """How to search. `max_memory_mb` rejects candidates whose peak memory is above it, except
    PyTorch's default: it is the baseline every speedup is measured against and what runs without
    the advisor, so it is always measured and kept (with a warning when it is over the limit)."""

    mode: Mode = "infer"
    trials: int | None = None  # overrides the space's budget.trials
    storage: str | None = None  # None: the embedded default; 'memory': not stored
    study_name: str | None = None
    isolate: bool = False
    trial_timeout_s: float = 600.0
    max_memory_mb: float | None = None
    objectives: tuple[str, ...] = ("time",)
    fresh: bool = False  # discard a stored study of the same name first
    progress: Callable[[Progress], None] | None = None
    steps: int | None = None  # the training steps the advice is for (--steps): its horizon
    # Told the seconds each wait for a worker process's start took (the Time line's part).
    on_start: Callable[[float], None] | None = None
    # No new trial after this `time.perf_counter()` value, and sampling is cut there (the run's
    # time budget, less what its later stages need); None: the space's budget.time_s from start.
    deadline: float | None = None
    # Screen a fresh grid's candidates before timing the survivors in full (advisor.search.screen).
    screen: bool = False
    # The per-layer stage measures every layer group (full effort), or only those that carry
    # most of the conv work (default effort: advisor.stages.layer_share).
    every_layer_group: bool = True
    check_always: bool = True  # the final check runs whatever the margin (quick: `beyond_noise`)

    def __post_init__(self) -> None:
        limits = (("--trial-timeout", self.trial_timeout_s), ("--max-memory", self.max_memory_mb))
        for option, value in limits:
            if value is not None and not 0 < value < math.inf:
                raise AdvisorError(f"{option} must be a positive number, got {value:g}")


class SearchOutcome:
    """What a run has measured so far (its `ledger`, the one record every stage reads and
    adds to) and what it knows of the rest: the candidates the space dropped, those the budget
    left unmeasured, what screening did. `results`, `baseline` and `trial_origins` are read
    from the ledger; built from a list of results (a test, a reused advice), the ledger holds
    them as trials."""

    def __init__(
        self,
        results: Sequence[TrialResult] | None = None,
        baseline: TrialResult | None = None,
        dropped: list[Dropped] | None = None,
        study_name: str = "",
        environment: Environment | None = None,
        elapsed_s: float = 0.0,
        pareto: bool = False,
        not_measured: list[str] | None = None,
        screen_note: str | None = None,
        *,
        ledger: Ledger | None = None,
        shared_checks: SharedChecks | None = None,
    ) -> None:
        if ledger is None:
            assert baseline is not None, "an outcome from results needs its baseline"
            ledger = Ledger.of(results or [], baseline.settings)
        self.ledger = ledger
        self.dropped = dropped if dropped is not None else []
        self.study_name = study_name
        assert environment is not None
        self.environment = environment
        self.elapsed_s = elapsed_s
        self.multi = pareto  # a time,memory search: its Pareto set is reported
        self.not_measured = not_measured if not_measured is not None else []
        self.screen_note = screen_note
        self.shared_checks = shared_checks  # precision verdicts of the model's other studies

    @property
    def results(self) -> list[TrialResult]:
        return self.ledger.results()

    @property
    def baseline(self) -> TrialResult:
        base = self.ledger.baseline()
        assert base is not None, "no measurement of PyTorch's default"
        return base

    @property
    def trial_origins(self) -> list[tuple[int, Stage]]:
        return self.ledger.origins()

    @property
    def pareto(self) -> list[TrialResult]:
        """A time,memory search's Pareto set (empty for a search on time alone)."""
        from advisor.search.pick import pareto_front

        return pareto_front(self.results) if self.multi else []


@dataclass(frozen=True)
class WorkSummary:
    """What one process (an `advisor worker`) did in a shared study."""

    study_name: str
    evaluated_here: int
    failed_here: int
    evaluated: int  # grid points with a result, by any process
    total: int
    elapsed_s: float
