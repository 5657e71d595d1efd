"""What the precision check (`advisor.gate.precision`) is told and what it finds: plain
pydantic models, stored with trial results and in search spaces."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.knobs import Settings

__all__ = [
    "PrecisionCheck",
    "PrecisionCheckSettings",
    "judged",
    "own_path",
    "path_name",
    "round_up",
]


def own_path(settings: Settings) -> Settings:
    """PyTorch's own path at the candidate's precision: its autocast or TF32 flags, native
    kernels, contiguous."""
    if settings.amp != "off":
        return Settings(amp=settings.amp)
    return Settings(tf32=settings.tf32, cpu_fp32=settings.cpu_fp32)


def judged(precision: str | None, settings: Settings, known: Iterable[Settings]) -> bool:
    """Whether a candidate at `precision` needs no training check: the fp32 class, PyTorch's
    own default path, or a precision whose own path has a verdict in `known`."""
    own = own_path(settings)
    return precision in (None, "fp32") or own == Settings() or own in known


def path_name(own: Settings, precision: str) -> str:
    """What a precision verdict calls PyTorch's own path at that precision."""
    if own.cpu_fp32 == "bf16":
        return "bf16 fp32 convs (oneDNN)"
    if own.tf32 == "on" and own.amp == "off":
        return "tf32 convs and matmuls"
    return precision


class PrecisionCheckSettings(BaseModel):
    """How a precision is judged on the model (search-space section `precision_check`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # 16 gave the zoo's verdicts of 32 at half the time; one outside at 16 trains on (`max_steps`)
    steps: int = Field(16, ge=2, description="optimiser steps of each training run")
    batches: int = Field(4, ge=1, description="fixed synthetic batches, used in turn")
    lr: float = Field(1e-3, gt=0, description="Adam's learning rate")
    teacher_noise: float = Field(
        0.5, gt=0, description="the teacher's parameters: the model's moved by this x their RMS"
    )
    jitter: float = Field(1e-5, gt=0, description="fp32 run with inputs moved by this (relative)")
    # 0: leaving it out can only narrow the band (reject more); it saves a third of the fp32 side
    jitter_runs: int = Field(0, ge=0, description="fp32 runs with jittered inputs")
    batch_runs: int = Field(1, ge=0, description="fp32 runs on other batches of the same kind")
    band_factor: float = Field(
        1.5,
        gt=0,
        description="train: accept when the precision's final loss is behind fp32's by at most "
        "this x the fp32 band (fp32's own final loss on other batches, each over its start)",
    )
    # 0.25: well below what fp32 learns at the rate kept on the CPU zoo (47-98% of the start),
    # far from a rate it does not learn at (MobileNetV3-Small at Adam 1e-3 ends at 2-10x its start).
    min_learnt: float = Field(
        0.25,
        ge=0,
        lt=1,
        description="train: the check judges only where fp32 learns its task: a steady run (no "
        "pass's mean loss above 1.1 x the start) whose final loss is at most (1 - this) x the "
        "start; else the precision is not judged (not accepted)",
    )
    # 0.05: a band of 19% of the start would accept any precision that ends within 29% of fp32
    max_band: float = Field(
        0.05,
        gt=0,
        description="train: the check judges only where the fp32 band (how far fp32 ends on "
        "other batches, each run over its own start) is within this fraction of the start; else "
        "the precision is not judged (not accepted)",
    )
    # 0.01: Intel Neural Compressor's default tolerable_loss (0.01 relative) and Olive's example
    # max-degradation (0.01), taken on what fp32 learnt: a precision may end 1% of that behind.
    max_degradation: float = Field(
        0.01,
        ge=0,
        description="train: accept when the precision's final loss (its trained weights in fp32) "
        "is behind fp32's by at most this fraction of what fp32 learnt (its loss drop over the "
        "start)",
    )
    # 64: a lag early in a run shrinks as fp32's loss flattens; paid only by a precision outside
    # at `steps`.
    max_steps: int = Field(
        64,
        ge=2,
        description="train: a precision outside at `steps` is trained again, twice as long each "
        "time up to this many steps, while its gap closes; judged at the longest",
    )
    # 1: below one half-ulp an update rounds away in the precision's forward until updates add
    # up past it, so the precision's curve lags for a reason that is not training.
    visible_step: float = Field(
        1.0,
        ge=0,
        description="train: a precision outside is not judged (rather than rejected) where an "
        "Adam step (about lr) is below this x its half-ulp of the weights' median size",
    )
    # 4: the held-out look (`advisor.gate.held_out`) judges only where a precision that learnt
    # nothing would end at least 4x outside its allowance (on the CPU test models fp32 learns
    # 15-40% on held-out batches, against allowances of 0.2-0.6%).
    held_signal: float = Field(
        4.0,
        gt=0,
        description="train: a precision outside on its training batches is judged on held-out "
        "batches only where fp32's drop there is at least this x the allowance",
    )
    signal_tolerance: float = Field(
        0.1, gt=0, description="infer: output error over the outputs' spread across the batch"
    )


class PrecisionCheck(BaseModel):
    """How one precision was judged on this model, and the numbers behind the verdict."""

    # Inf and NaN (a diverged run; a gap not measured) written as JSON's Infinity and NaN, so a
    # verdict stored with the study reads back.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")
    precision: str
    own_path: Settings  # PyTorch's own path at that precision, as run
    mode: Literal["train", "infer"]
    accepted: bool
    # train: False where the check could not tell (fp32 did not learn its task, its band is over
    # `max_band`, or the precision lagged at a rate whose Adam step is below its resolution): not
    # accepted, gap NaN (no setting accepts it), the summary says why
    judged: bool = True
    summary: str  # one line for the result, the config and the report
    # train: how far the precision's final loss (trained weights in fp32) ends behind fp32's,
    # over the start (negative: ahead); infer: error over the signal
    gap: float
    band: float  # train: how far fp32's own band runs end from it; infer: the signal tolerance
    start: float = 0.0  # train: the fp32 reference's starting loss (the untrained model's)
    lr: float = 0.0  # train: the learning rate the runs used
    # train: the gap accepted whatever the band (`max_degradation` x what fp32 learnt)
    floor: float = 0.0
    steps: int = 0  # train: the length of the runs the verdict was judged at
    losses: dict[str, list[float]] = Field(default_factory=dict)  # run -> loss per step
    # train: the look on held-out batches where it was taken (`advisor.gate.held_out`): its gap,
    # band, what fp32 learnt there and the allowance, each over the held-out start
    held_out: dict[str, float] | None = None
    top1_agreement: float | None = None
    seconds: float = 0.0
    # judged before this run (an earlier run of the study, or another study of the model):
    # `seconds` were not this run's (advisor.search.shared_checks)
    reused: bool = False

    def rejection(self) -> tuple[Literal["precision"], str, str]:
        """A candidate at this precision, where it was not accepted: its rejection's kind, its
        reason, and the precision_check setting that would accept it ("" where none would)."""
        reason = f"{self.summary}: {self.precision} is not accepted here"
        if not math.isfinite(self.gap):
            return "precision", reason, ""  # Inf or NaN: nothing accepts it
        if self.mode == "infer":
            return "precision", reason, f"precision_check.signal_tolerance={round_up(self.gap)}"
        factor = round_up(self.gap / max(self.band, 1e-12))
        return "precision", reason, f"precision_check.band_factor={factor}"


def round_up(x: float) -> str:
    """`x` rounded up to two significant digits, for a setting that accepts it."""
    if x <= 0 or not math.isfinite(x):
        return f"{x:g}"
    exp = math.floor(math.log10(x)) - 1
    return f"{math.ceil(x / 10**exp) * 10**exp:.2g}"
