"""What a search is asked (`SearchOptions`) and what it returns (`SearchOutcome`, `Progress`,
`WorkSummary`). No optuna here: the service and the CLI read these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from advisor.device.environment import Environment
from advisor.measure.candidate import Mode
from advisor.measure.results import TrialResult
from advisor.space import Dropped

WAIT_S = 1.0  # how often a process waiting for other workers' trials looks again


class CandidateFailed(Exception):
    """Raised inside the objective so optuna records the trial as FAIL; the reason is an attr."""


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    best_ms: float | None
    last: TrialResult | None
    elapsed_s: float
    stage: str = "global knobs"
    ended_s: float | None = None  # set once, when the stage's span ends: its wall time


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


@dataclass
class SearchOutcome:
    results: list[TrialResult]
    baseline: TrialResult
    dropped: list[Dropped]
    study_name: str
    environment: Environment
    elapsed_s: float
    trial_numbers: list[int] = field(default_factory=list)
    pareto: list[TrialResult] = field(default_factory=list)  # time,memory mode: the Pareto set
    not_measured: list[str] = field(default_factory=list)  # candidates the budget left out
    screen_note: str | None = None  # what screening dropped, or why it fell back to full timing


@dataclass(frozen=True)
class WorkSummary:
    """What one process (an `advisor worker`) did in a shared study."""

    study_name: str
    evaluated_here: int
    failed_here: int
    evaluated: int  # grid points with a result, by any process
    total: int
    elapsed_s: float
