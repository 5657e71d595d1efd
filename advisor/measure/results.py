"""What a measured candidate is: a `TrialResult`, stored with its optuna trial and read by the
pick, the re-time, the advice, the report and the isolated workers."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from advisor.knobs import Settings
from advisor.measure.stats import Measurement
from advisor.measure.stop import Stop
from advisor.measure.verdict import PrecisionCheck

__all__ = ["Failure", "Pending", "Rejection", "Status", "TrialResult"]

Status = Literal["ok", "rejected", "failed", "stopped"]  # stopped: out of the pick, not gated
# What a candidate measured without its gate waits for, gated only where the pick needs it:
# its precision's training check, a compiled candidate's capture under dropout (a second
# compile), or its numeric checks (measured above the bar of the fastest candidate of its time,
# or its precision accepted since on another candidate)
Pending = Literal["precision", "capture", "checks"]
# A failure's kind (out of memory; a device error, after which the worker is replaced; its
# worker's crash, time limit or failed start) and a rejection's (NaN or Inf, an error over a
# tolerance, a precision its training check did not accept, a peak memory over --max-memory)
Failure = Literal["oom", "device", "crash", "timeout", "start"]
Rejection = Literal["not_finite", "tolerance", "precision", "memory"]
_WAITS = {
    "precision": "its precision's training check was not paid",
    "capture": "its gate's capture under dropout (a second compile) was not paid",
    "checks": "its numeric checks were not paid",
}


class TrialResult(BaseModel):
    """One measured (or failed) candidate. Stored with its optuna trial."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    settings: Settings
    status: Status
    # What a person reads: a failure's or a rejection's own words, or `stop.text()`
    reason: str | None = None
    stop: Stop | None = None  # status "stopped": why, as a kind and its figures
    failure: Failure | None = None  # status "failed": its kind, where one is known
    rejection: Rejection | None = None  # status "rejected": its kind
    measurement: Measurement | None = None
    rel_error: float | None = None  # outputs vs the fp32 reference
    grad_error: float | None = None  # all parameter and input gradients together (train mode)
    precision: str = "fp32"
    tolerance: float | None = None
    grad_tolerance: float | None = None
    tolerance_basis: str | None = None  # how the model-level tolerances were set
    layer_error: float | None = None  # the worst conv layer alone vs float64
    layer_tolerance: float | None = None
    layer_detail: str | None = None  # which layer and tensor that was
    rejected_by: str | None = None  # the space setting that would accept it, as key=value
    precision_check: PrecisionCheck | None = None  # how its precision was judged on the model
    peak_memory_mb: float | None = None  # steady state: warm-up and samples
    first_call_peak_mb: float | None = None  # the first call's (autotuning, benchmark search)
    per_shape: list[Measurement] | None = None  # a shape set: one measurement per shape
    # torch.compile's cost, kept out of the samples: the first call of every shape with empty
    # compile caches (None where it read a graph another candidate compiled: `compile_bill`)
    compile_cold_s: float | None = None
    # Inductor's one-off start in the trial's process (imports, the C++ compiler's checks), paid
    # by its first compiled candidate before its cold compile: the machine's cost, not the model's
    compile_start_s: float | None = None
    # The gate's capture of a compiled candidate under its dropout masks: another graph, compiled
    # with empty caches after the timed steps (a model without dropout is captured as timed)
    compile_check_s: float | None = None
    payback: list[Measurement] | None = None  # its payback rounds, its and its rival's samples
    # The gate's own checks of this candidate: its capture against the fp32 reference and its
    # conv layers alone against float64 (the training check, once per precision, is
    # `precision_check.seconds`): the numeric verdict's cost, not the harness's
    gate_s: float | None = None
    # Where Dynamo broke a compiled candidate's graph ('file.py:123: reason'), each place once
    # (`advisor.compiled.graph_breaks`); None for an eager candidate
    graph_breaks: list[str] | None = None
    retimed: bool = False  # measured in the interleaved re-time of the finalists
    # Measured, not gated yet: gated only where it could be picked; never recommended, and
    # never a race's leader, while set
    pending: Pending | None = None
    # A survivor of a screen (advisor.search.screen), timed in full on the candidate its screen
    # built (advisor.execute.park): the screen's samples, kept apart from the measurement's
    screen: Measurement | None = None
    # What a re-time replaced (the trial's own measurement, an earlier re-time's; per shape where
    # the workload has a shape set): samples the run took, kept for its accounting
    # (`advisor.stages.walltime.timed_by_stage`), never compared
    replaced: list[Measurement] = Field(default_factory=list)
    wall_s: float | None = None  # the trial's own wall time: set-up, samples, checks, compiles

    @model_validator(mode="after")
    def _reason_from_stop(self) -> TrialResult:
        if self.reason is None and self.stop is not None:
            object.__setattr__(self, "reason", self.stop.text())
        elif self.reason is None and self.pending is not None:
            object.__setattr__(self, "reason", f"not gated: the pick never needed its verdict "
                                               f"({_WAITS[self.pending]})")
        return self

    @property
    def kind(self) -> str:
        """Why it is out of the pick, as a kind: its stop's, failure's or rejection's ('')."""
        return self.stop.kind if self.stop is not None else self.failure or self.rejection or ""

    @property
    def shown_status(self) -> str:
        """The status a person reads: a candidate measured but never gated says so."""
        return "not gated" if self.pending is not None else self.status

    @property
    def median_ms(self) -> float:
        return self.measurement.median_ms if self.measurement else math.inf
