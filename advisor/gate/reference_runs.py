"""The fp32 side of the training check (`advisor.gate.precision`), the same whichever precision
is judged against it: the task's batches and targets, the learning rate fp32 learns the task at,
fp32's reference run there and, where a verdict needs them, its band's runs (fp32 on other
batches of the same kind; optionally on jittered inputs).

A run ends with its trained weights' mean loss in fp32 (`training.train`); gaps are between
those final losses, each over its run's own starting loss (a run on other batches starts
elsewhere, up to 9% apart on ResNet-18, then learns alike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from advisor.gate import training
from advisor.measure.candidate import Mode
from advisor.measure.verdict import PrecisionCheckSettings
from advisor.workload.build import Workload

__all__ = ["Fp32Runs", "final_gap", "fp32_runs", "learnt"]


def _fits(ref: list[float], batches: int, start: float, cfg: PrecisionCheckSettings) -> str:
    """How fp32 did at a rate: "learns" the check's task (steady: every pass's mean loss within
    `training.STEADY` x the start, all finite; and a final loss at most (1 - `min_learnt`) x the
    start), "unsteady", or "slow" (steady, but learnt too little)."""
    e = training.epochs(ref, batches)
    if len(ref) != cfg.steps + 1 or not all(math.isfinite(x) and x <= training.STEADY * start
                                            for x in e):  # fmt: skip
        return "unsteady"
    return "learns" if e[-1] <= (1 - cfg.min_learnt) * start else "slow"


def learnt(ref: list[float], start: float) -> float:
    """What a run learnt: its loss drop from the start to the end, over the start."""
    return max(0.0, start - ref[-1]) / max(abs(start), 1e-12)


def final_gap(run: list[float], ref: list[float], start: float, ref_start: float) -> float:
    """How far a run ends behind the reference: the difference of their final losses (trained
    weights in fp32), each over its own start; negative where it ends ahead; Inf where it
    diverged or stopped early."""
    if len(run) != len(ref) or not all(math.isfinite(x) for x in run):
        return math.inf
    return run[-1] / max(abs(start), 1e-12) - ref[-1] / max(abs(ref_start), 1e-12)


@dataclass(frozen=True)
class Fp32Runs:
    """The fp32 side of a training check, the same whichever precision is judged against it:
    the batches and their targets, the task's starting loss, the learning rate fp32 learns it at,
    the fp32 runs (the reference and the band's) and their band, or why the check cannot judge.
    Kept per model and measured once, so a second precision (bf16 autocast, then oneDNN's bf16
    fp32 convs) costs one training run, not four."""

    cfg: PrecisionCheckSettings  # at the learning rate kept
    batches: list
    targets: list
    runs: dict[str, list[float]]
    start: float
    band: float
    refused: str | None = None  # why no precision is judged on this task (None: they are)
    starts: dict[str, float] = field(default_factory=dict)  # a band run's own starting loss
    # False: the band's runs were not made (`band=False`): `band` is NaN, and a precision is
    # accepted without them only within `max_degradation` x what fp32 learnt (`check_precision`)
    banded: bool = True
    probes: dict[float, list[float]] = field(default_factory=dict)  # each rate's reference
    # the trained weights of the runs above that finished (run name, or a probe's rate), for
    # the look on held-out batches (`advisor.gate.held_out`)
    weights: dict[str, training.Weights] = field(default_factory=dict)
    probe_weights: dict[float, training.Weights] = field(default_factory=dict)


def fp32_runs(
    workload: Workload,
    device: torch.device,
    mode: Mode,
    cfg: PrecisionCheckSettings,
    seed: int = 0,
    deadline: float | None = None,
    band: bool = True,
    probes: dict[float, list[float]] | None = None,
    probe_weights: dict[float, training.Weights] | None = None,
) -> Fp32Runs:
    """The fp32 runs at a learning rate where fp32 learns the task (`_fits`) with a band within
    `max_band`: `lr` first; then down by 10x, to lr/100 at most, while fp32 is unsteady there or
    its band too wide; or up by 10x, once, where it learnt too little (a lower rate learns
    less). Each rate's reference is a probe that stops at its first unsteady pass. Where no rate
    qualifies, the runs say why: those of the narrowest band of the rates fp32 learnt at (too
    wide), else the last rate tried (not learnt).

    `band=False` stops at the first rate fp32 learns at, without the band's runs (`banded`
    False); `probes` are references already run, by rate (a search without the band, taken on
    with it, and their trained weights)."""
    known, known_w = dict(probes or {}), dict(probe_weights or {})
    batches = training.batches_of(workload, cfg.batches, 1000 + 100 * seed)
    targets = training.targets_of(workload, batches, device, mode, cfg, seed)
    start = training.start_loss(workload, device, batches, targets)
    tried: list[tuple[float, list[float], str]] = []  # (rate, its reference's losses, _fits)
    power, turn, kept = 0, 0, None  # the rate is lr x 10**power; turn: -1 down, +1 up
    while True:
        lr = cfg.lr * 10**power if power >= 0 else cfg.lr / 10**-power
        at = cfg.model_copy(update={"lr": lr})
        if lr in known:
            ref = known[lr]
        else:
            kept_w: list[training.Weights] = []
            try:
                ref = training.train(workload, training.REFERENCE, device, batches, targets, at,
                                     deadline=deadline, probe=start, keep=kept_w)  # fmt: skip
            except training.Unsteady as e:
                ref = e.losses
            known[lr] = ref
            if kept_w:
                known_w[lr] = kept_w[0]
        fits = _fits(ref, at.batches, start, at)
        tried.append((lr, ref, fits))
        if fits != "learns":  # never the rate kept: its weights are not looked at again
            known_w.pop(lr, None)
        mine = {"fp32": known_w[lr]} if lr in known_w else {}
        if fits == "learns" and not band:
            return Fp32Runs(at, batches, targets, {"fp32": ref}, start, math.nan,
                            starts={"fp32": start}, banded=False, probes=known, weights=mine,
                            probe_weights=known_w)  # fmt: skip
        if fits == "learns":
            runs, width, starts = _band(workload, device, mode, at, seed, deadline, batches,
                                        targets, ref, start, mine)  # fmt: skip
            found = Fp32Runs(at, batches, targets, runs, start, width, starts=starts,
                             probes=known, weights=mine, probe_weights=known_w)  # fmt: skip
            if width <= at.max_band:
                return found
            if kept is None or width < kept.band:
                kept = replace(found, refused=_too_wide(ref, start, width, at))
        want = 1 if fits == "slow" else -1  # unsteady, or a band too wide: slower
        turn = turn or want  # the first rate sets the direction; a turn ends the search
        power += turn
        if want != turn or not -2 <= power <= 1:
            break
    if kept is not None:
        return kept
    last = cfg.model_copy(update={"lr": tried[-1][0]})
    why = _not_learnt(start, tried, last)
    return Fp32Runs(last, batches, targets, {"fp32": tried[-1][1]}, start, math.nan, why,
                    probes=known, probe_weights=known_w)  # fmt: skip


def _band(
    workload: Workload,
    device: torch.device,
    mode: Mode,
    cfg: PrecisionCheckSettings,
    seed: int,
    deadline: float | None,
    batches: list,
    targets: list,
    ref: list[float],
    start: float,
    weights: dict[str, training.Weights],
) -> tuple[dict[str, list[float]], float, dict[str, float]]:
    """The band's fp32 runs beside the reference: jittered inputs (`jitter_runs`), other batches
    of the same kind (`batch_runs`); their largest distance from the reference at the end, each
    run over its own start; and those starts. The other batches' trained weights go into
    `weights`."""
    runs, gaps, starts = {"fp32": ref}, [], {"fp32": start}
    for j in range(cfg.jitter_runs):
        run = training.train(workload, training.REFERENCE, device, batches, targets, cfg,
                             cfg.jitter * (1 + j), deadline)  # fmt: skip
        runs[f"fp32 jittered {j + 1}"] = run
        starts[f"fp32 jittered {j + 1}"] = start
        gaps.append(abs(final_gap(run, ref, start, start)))
    for k in range(cfg.batch_runs):
        other = training.batches_of(workload, cfg.batches, 5000 + 100 * seed + 10 * k)
        aims = training.targets_of(workload, other, device, mode, cfg, seed)
        kept_w: list[training.Weights] = []
        run = training.train(workload, training.REFERENCE, device, other, aims, cfg,
                             deadline=deadline, keep=kept_w)  # fmt: skip
        runs[f"fp32 other batches {k + 1}"] = run
        weights.update({f"fp32 other batches {k + 1}": w for w in kept_w})
        own = training.start_loss(workload, device, other, aims)
        starts[f"fp32 other batches {k + 1}"] = own
        gaps.append(abs(final_gap(run, ref, own, start)))
    return runs, max(gaps, default=0.0), starts


def _not_learnt(
    start: float, tried: list[tuple[float, list[float], str]], cfg: PrecisionCheckSettings
) -> str:
    """Why fp32 did not learn the task: what it did at each rate tried."""
    said = []
    for lr, ref, fits in tried:
        e = training.epochs(ref, cfg.batches)
        if fits == "unsteady":
            said.append(f"at lr {lr:g} its loss rose to {max(e):.3g} (mean of a pass)")
        else:
            said.append(f"at lr {lr:g} it fell only to {ref[-1]:.3g}")
    return (
        f"fp32 itself did not learn the check's task in {cfg.steps} steps (loss at the start "
        f"{start:.3g}; " + "; ".join(said) + f"; learnt: no pass above {training.STEADY:g} x the "
        f"start and the end at most {1 - cfg.min_learnt:g} x it)"
    )


def _too_wide(ref: list[float], start: float, band: float, cfg: PrecisionCheckSettings) -> str:
    return (
        f"fp32's own band is too wide to tell a precision by ({cfg.steps} steps at lr "
        f"{cfg.lr:g}, loss {start:.3g} -> {ref[-1]:.3g} in fp32; on other batches it ends "
        f"{band:.1%} of the start away, over the {cfg.max_band:.0%} the check judges within; the "
        "narrowest band of the rates it learnt at)"
    )
