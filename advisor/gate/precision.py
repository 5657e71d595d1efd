"""Whether a reduced precision (bf16, fp16 with its GradScaler, TF32, oneDNN's bf16 fp32 convs)
is acceptable for this model: decided by what it does to training (or, in infer mode, to the
outputs' information), measured once per precision per model.

One step's rounding is the wrong yardstick for "does my model still train": on real networks
PyTorch's own bf16 path differs from fp32 after one step by far more than any fixed tolerance
(ResNet-18's first-step gradients by 0.37), yet it trains; rounding noise in a gradient is small
next to the noise between two mini-batches, which SGD lives with. So, in train mode:

- a task the model can learn at the scale of its own outputs: fixed synthetic batches drawn like
  the example inputs, and as targets the outputs of a *teacher*, the same model with every
  parameter moved by `teacher_noise` x its RMS (computed once, in fp32);
- `steps` optimiser steps (Adam) from the same initial weights, batches in turn, each batch
  under its own fixed dropout masks (those of its targets); the loss is the relative squared
  error to the teacher, summed over outputs; the **start** is the untrained model's mean loss
  over the batches;
- the learning rate: one at which fp32 *learns the task* (steady: no pass through the batches
  with a mean loss above 1.1 x the start; and ending at most (1 - `min_learnt`) x the start)
  with a band (below) within `max_band` of the start: `lr`, else 10x lower (to lr/100) where
  fp32 is unsteady or its band too wide, or 10x higher where it learnt too little;
- runs: the fp32 reference; fp32 on other batches of the same kind (and their teacher targets):
  the mini-batch noise SGD lives with; optionally (`jitter_runs`, 0 by default) fp32 with the
  inputs moved by `jitter` (relative): the model's own run-to-run sensitivity, 11-7,000 times
  smaller than the mini-batch noise on every network and draw measured
  (benchmarks/results/check_cost_cpu.md); and the precision through PyTorch's own path
  (autocast, the GradScaler for fp16, the TF32 or oneDNN flags);
- the gap of a run is the largest difference of its mean loss per pass from the reference's,
  over the start (an fp32 run on other batches: each run over its own start); the **band** is
  the largest gap of the fp32 runs. The precision is accepted when its losses stay finite and
  its gap is within `band_factor` x the band (it trains like fp32 does with other inputs), or
  within `resolution` x what fp32 learnt. That second rule needs no band, so the band's runs
  are made only for a precision outside it: bf16 on small_cnn (a gap of 0.0% of the start) and
  ResNet-18 (0.6% against 0.9%) skip a third of the check;
- **not judged** (so not accepted, and the precision not run) where no rate qualifies: fp32
  itself did not learn the task, or its band is over `max_band` at every rate it learnt at. A
  check is only as sharp as fp32's own learning on its task: MobileNetV3-Small at Adam 1e-3 went
  from 0.925 to 1.71, and its band of 19% of the start would have accepted almost anything.

In infer mode, the precision's output error relative to how much the outputs vary across the
batch (the information they carry) must be within `signal_tolerance`, outputs finite; for a
classifier-shaped output the top-1 agreement with fp32 is reported.

Error modes, said plainly: a model that learns little in `steps` steps makes every gap small (a
precision that would drift later is not caught: `min_learnt` bounds how little); the band from a
single other draw can be small or large by chance (`batch_runs`, `jitter_runs` add draws), and a
wide one refuses to judge rather than accept. The per-layer check against
float64 (advisor/gate/numeric.py) still catches a wrong kernel at any precision.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import torch

from advisor.apply import apply_settings
from advisor.gate import training
from advisor.gate.training import CheckOutOfTime
from advisor.knobs import Settings
from advisor.measure.candidate import Mode
from advisor.measure.verdict import PrecisionCheck, PrecisionCheckSettings
from advisor.workload.build import Workload

__all__ = [
    "CheckOutOfTime",
    "Fp32Runs",
    "PrecisionCheck",
    "PrecisionCheckSettings",
    "check_precision",
    "fp32_runs",
]


def _fits(ref: list[float], batches: int, start: float, cfg: PrecisionCheckSettings) -> str:
    """How fp32 did at a rate: "learns" the check's task (steady: every pass's mean loss within
    `training.STEADY` x the start, all finite; and a final loss at most (1 - `min_learnt`) x the
    start), "unsteady", or "slow" (steady, but learnt too little)."""
    e = training.epochs(ref, batches)
    if len(ref) != cfg.steps + 1 or not all(math.isfinite(x) and x <= training.STEADY * start
                                            for x in e):  # fmt: skip
        return "unsteady"
    return "learns" if e[-1] <= (1 - cfg.min_learnt) * start else "slow"


def _learnt(ref: list[float], start: float) -> float:
    """What a run learnt: its loss drop from the start to the end, over the start."""
    return max(0.0, start - ref[-1]) / max(abs(start), 1e-12)


def _gap(run: list[float], ref: list[float], batches: int, start: float, ref_start: float) -> float:
    """The largest difference between two runs' epoch losses, each over its own start (a run on
    other batches starts elsewhere: ResNet-18's other draws start up to 9% apart, then learn
    alike)."""
    if len(run) != len(ref) or not all(math.isfinite(x) for x in run):
        return math.inf
    a, b = training.epochs(run, batches), training.epochs(ref, batches)
    s, r = max(abs(start), 1e-12), max(abs(ref_start), 1e-12)
    return max(abs(x / s - y / r) for x, y in zip(a, b, strict=True))


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
    # accepted without them only within `resolution` x what fp32 learnt (`check_precision`)
    banded: bool = True
    probes: dict[float, list[float]] = field(default_factory=dict)  # each rate's reference


def fp32_runs(
    workload: Workload,
    device: torch.device,
    mode: Mode,
    cfg: PrecisionCheckSettings,
    seed: int = 0,
    deadline: float | None = None,
    band: bool = True,
    probes: dict[float, list[float]] | None = None,
) -> Fp32Runs:
    """The fp32 runs at a learning rate where fp32 learns the task (`_fits`) with a band within
    `max_band`: `lr` first; then down by 10x, to lr/100 at most, while fp32 is unsteady there or
    its band too wide (MobileNetV3-Small at Adam 1e-3: the loss climbs tenfold; ResNet-18 at 1e-4
    doubles, then falls); or up by 10x, once, where it learnt too little (a lower rate learns
    less). Each rate's reference is a probe that stops at its first unsteady pass. Where no rate
    qualifies, the runs say why: those of the narrowest band of the rates fp32 learnt at (too
    wide), else the last rate tried (not learnt).

    `band=False` stops at the first rate fp32 learns at, without the band's runs (`banded`
    False); `probes` are references already run, by rate (a search without the band, taken on
    with it)."""
    known = dict(probes or {})
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
            try:
                ref = training.train(workload, training.REFERENCE, device, batches, targets, at,
                                     deadline=deadline, probe=start)  # fmt: skip
            except training.Unsteady as e:
                ref = e.losses
            known[lr] = ref
        fits = _fits(ref, at.batches, start, at)
        tried.append((lr, ref, fits))
        if fits == "learns" and not band:
            return Fp32Runs(at, batches, targets, {"fp32": ref}, start, math.nan,
                            starts={"fp32": start}, banded=False, probes=known)  # fmt: skip
        if fits == "learns":
            runs, width, starts = _band(workload, device, mode, at, seed, deadline, batches,
                                        targets, ref, start)  # fmt: skip
            found = Fp32Runs(at, batches, targets, runs, start, width, starts=starts,
                             probes=known)  # fmt: skip
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
                    probes=known)  # fmt: skip


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
) -> tuple[dict[str, list[float]], float, dict[str, float]]:
    """The band's fp32 runs beside the reference: jittered inputs (`jitter_runs`), other batches
    of the same kind (`batch_runs`); their largest gap, each run over its own start; and those
    starts."""
    runs, gaps, starts = {"fp32": ref}, [], {"fp32": start}
    for j in range(cfg.jitter_runs):
        run = training.train(workload, training.REFERENCE, device, batches, targets, cfg,
                             cfg.jitter * (1 + j), deadline)  # fmt: skip
        runs[f"fp32 jittered {j + 1}"] = run
        starts[f"fp32 jittered {j + 1}"] = start
        gaps.append(_gap(run, ref, cfg.batches, start, start))
    for k in range(cfg.batch_runs):
        other = training.batches_of(workload, cfg.batches, 5000 + 100 * seed + 10 * k)
        aims = training.targets_of(workload, other, device, mode, cfg, seed)
        run = training.train(workload, training.REFERENCE, device, other, aims, cfg,
                             deadline=deadline)  # fmt: skip
        runs[f"fp32 other batches {k + 1}"] = run
        own = training.start_loss(workload, device, other, aims)
        starts[f"fp32 other batches {k + 1}"] = own
        gaps.append(_gap(run, ref, cfg.batches, own, start))
    return runs, max(gaps, default=0.0), starts


def _gap_and_floor(run: list[float], fp32: Fp32Runs) -> tuple[float, float]:
    """A precision's run against fp32's reference: its gap, and the floor (`resolution` x what
    fp32 learnt) within which it is accepted whatever the band."""
    ref, cfg = fp32.runs["fp32"], fp32.cfg
    gap = _gap(run, ref, cfg.batches, fp32.start, fp32.start)
    return gap, cfg.resolution * _learnt(ref, fp32.start)


def _within_floor(run: list[float], fp32: Fp32Runs) -> bool:
    gap, floor = _gap_and_floor(run, fp32)
    return math.isfinite(gap) and gap <= floor


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
        f"{cfg.lr:g}, loss {start:.3g} -> {ref[-1]:.3g} in fp32; on other batches its loss "
        f"curve is {band:.1%} of the start away, over the {cfg.max_band:.0%} the check judges "
        "within; the narrowest band of the rates it learnt at)"
    )


def check_precision(
    workload: Workload,
    own_path: Settings,
    precision: str,
    device: torch.device,
    mode: Mode,
    cfg: PrecisionCheckSettings,
    seed: int = 0,
    deadline: float | None = None,
    fp32_cache: dict[tuple[int, PrecisionCheckSettings], Fp32Runs] | None = None,
) -> PrecisionCheck:
    """Judge PyTorch's own path at `precision` (`own_path`) on this model (see the module doc).
    Raises `CheckOutOfTime` when `deadline` (a `time.perf_counter()` time) passes first.
    `fp32_cache` (one per model and device) keeps the fp32 runs for the next precision."""
    begun = time.perf_counter()
    if mode == "infer":
        return _check_outputs(workload, own_path, precision, device, cfg, seed, begun)
    key = (seed, cfg)
    fp32 = fp32_cache.get(key) if fp32_cache is not None else None
    if fp32 is None:
        # The band's runs (a third of the check) are made only where the verdict needs them:
        # a gap within `resolution` x what fp32 learnt is accepted whatever the band.
        fp32 = fp32_runs(workload, device, mode, cfg, seed, deadline, band=False)
    run: list[float] | None = None
    if fp32.refused is None:
        run = training.train(workload, own_path, device, fp32.batches, fp32.targets, fp32.cfg,
                             deadline=deadline)  # fmt: skip
        if not fp32.banded and not _within_floor(run, fp32):
            lr = fp32.cfg.lr
            fp32 = fp32_runs(workload, device, mode, cfg, seed, deadline, probes=fp32.probes)
            if fp32.refused is not None:
                run = None
            elif fp32.cfg.lr != lr:  # fp32's band too wide there: judged at the rate kept
                run = training.train(workload, own_path, device, fp32.batches, fp32.targets,
                                     fp32.cfg, deadline=deadline)  # fmt: skip
    if fp32_cache is not None:
        fp32_cache[key] = fp32
    cfg, runs, start, band = fp32.cfg, dict(fp32.runs), fp32.start, fp32.band
    ref = runs["fp32"]
    common = dict(precision=precision, own_path=own_path, mode="train", band=band, start=start,
                  lr=cfg.lr)  # fmt: skip
    if fp32.refused is not None or run is None:  # not run: nothing it does could be told
        return PrecisionCheck(**common, accepted=False, judged=False, gap=math.nan, losses=runs,
                              summary=f"{precision}: not judged on this model: {fp32.refused}",
                              seconds=time.perf_counter() - begun)  # fmt: skip
    runs[precision] = run
    gap, floor = _gap_and_floor(run, fp32)
    in_band = fp32.banded and gap <= cfg.band_factor * band
    accepted = math.isfinite(gap) and (in_band or gap <= floor)
    trained = f"{start:.3g} -> {ref[-1]:.3g} in fp32"
    if accepted:
        head = (
            f"{precision}: trains like fp32 on this model ({cfg.steps} steps at lr {cfg.lr:g}, "
            f"loss {trained}; its largest loss gap "
        )
        if in_band:
            tail = f"{gap:.1%} of the start, within {cfg.band_factor:g} x the fp32 band {band:.1%})"
        elif fp32.banded:
            tail = (f"{gap:.2%} of the start, within {cfg.resolution:g} x what fp32 learnt "
                    f"({floor:.2%}; the fp32 band {band:.2%} is narrower than that)")  # fmt: skip
        else:
            tail = (f"{gap:.2%} of the start, within {cfg.resolution:g} x what fp32 learnt "
                    f"({floor:.2%}: accepted whatever fp32's band on other batches, not run)")  # fmt: skip
        summary = head + tail
    elif not math.isfinite(gap):
        summary = (
            f"{precision}: does not train on this model: its loss became Inf or NaN within "
            f"{cfg.steps} steps (fp32: {trained})"
        )
    else:
        summary = (
            f"{precision}: does not train like fp32 on this model ({cfg.steps} steps at lr "
            f"{cfg.lr:g}, loss "
            f"{trained}, {runs[precision][-1]:.3g} in {precision}; its largest loss gap "
            f"{gap:.1%} of the start, over {cfg.band_factor:g} x the fp32 band {band:.1%} and "
            f"{cfg.resolution:g} x what fp32 learnt)"
        )
    return PrecisionCheck(**common, accepted=accepted, summary=summary, gap=gap, floor=floor,
                          losses=runs, seconds=time.perf_counter() - begun)  # fmt: skip


def _outputs(
    workload: Workload, settings: Settings, device: torch.device, batches: list
) -> list[list[torch.Tensor]]:
    model = workload.make_model()
    model.eval()
    tuned = apply_settings(settings, model, device, training=False, warn=False)
    try:
        with torch.no_grad():
            return [[o.detach().float().cpu() for o in training.call_model(tuned, a, k, 0.0, 0)]
                    for a, k in batches]  # fmt: skip
    finally:
        tuned.restore()


def _check_outputs(
    workload: Workload,
    own_path: Settings,
    precision: str,
    device: torch.device,
    cfg: PrecisionCheckSettings,
    seed: int,
    begun: float,
) -> PrecisionCheck:
    """Infer mode: the precision's output error relative to the outputs' spread across the batch
    (the information they carry), and top-1 agreement where the output looks like logits."""
    batches = training.batches_of(workload, cfg.batches, 1000 + 100 * seed)
    ref = _outputs(workload, training.REFERENCE, device, batches)
    got = _outputs(workload, own_path, device, batches)
    worst, agree, total = 0.0, 0, 0
    for outs_r, outs_p in zip(ref, got, strict=True):
        for r, p in zip(outs_r, outs_p, strict=True):
            if not torch.isfinite(p).all():
                worst = math.inf
                continue
            spread = (
                (r - r.mean(dim=0, keepdim=True)).norm() if r.dim() and r.shape[0] > 1 else r.norm()
            )
            worst = max(worst, float((p - r).norm() / spread.clamp_min(1e-12)))
            if r.dim() == 2 and r.shape[1] > 1:
                agree += int((p.argmax(1) == r.argmax(1)).sum())
                total += r.shape[0]
    top1 = agree / total if total else None
    accepted = math.isfinite(worst) and worst <= cfg.signal_tolerance
    extra = f"; top-1 agreement {top1:.0%}" if top1 is not None else ""
    verdict = "keeps" if accepted else "does not keep"
    summary = (
        f"{precision}: {verdict} the outputs' information on this model (error {worst:.1e} of "
        f"their spread across the batch, limit {cfg.signal_tolerance:g}{extra})"
    )
    return PrecisionCheck(precision=precision, own_path=own_path, mode="infer", accepted=accepted,
                          summary=summary, gap=worst, band=cfg.signal_tolerance,
                          top1_agreement=top1, seconds=time.perf_counter() - begun)  # fmt: skip
