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
- `steps` optimiser steps (Adam, `lr`) from the same initial weights, batches in turn; the loss
  is the relative squared error to the teacher, summed over outputs;
- runs: the fp32 reference; fp32 on other batches of the same kind (and their teacher targets):
  the mini-batch noise SGD lives with; optionally (`jitter_runs`, 0 by default) fp32 with the
  inputs moved by `jitter` (relative): the model's own run-to-run sensitivity, 11-7,000 times
  smaller than the mini-batch noise on every network and draw measured
  (benchmarks/results/check_cost_cpu.md); and the precision through PyTorch's own path
  (autocast, the GradScaler for fp16, the TF32 or oneDNN flags);
- the gap of a run is the largest difference of its loss from the reference's at any step,
  relative to the reference's starting loss; the **band** is the largest gap of the fp32 runs.
  The precision is accepted when its losses stay finite and its gap is within `band_factor` x
  the band: it trains like fp32 does with other inputs.

In infer mode, the precision's output error relative to how much the outputs vary across the
batch (the information they carry) must be within `signal_tolerance`, outputs finite; for a
classifier-shaped output the top-1 agreement with fp32 is reported.

Error modes, said plainly: a model that barely learns in `steps` steps at `lr` makes every gap
small (a precision that would drift later is not caught); the band from a single other draw can
be small or large by chance (`batch_runs`, `jitter_runs` add draws). The per-layer check against
float64 (advisor/gate/numeric.py) still catches a wrong kernel at any precision.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

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


def _steady(losses: list[float], batches: int) -> bool:
    """Whether a run learnt without blowing up: its loss per pass never rose above the first
    pass's by more than 10%, and it ended below where it started."""
    e = training.epochs(losses, batches)
    return all(math.isfinite(x) for x in e) and max(e) <= 1.1 * e[0] and e[-1] < e[0]


def _learnt(ref: list[float], batches: int) -> float:
    """What a run learnt: its loss drop from the first pass to the end, over the first pass."""
    e = training.epochs(ref, batches)
    return max(0.0, e[0] - e[-1]) / max(abs(e[0]), 1e-12)


def _gap(run: list[float], ref: list[float], batches: int) -> float:
    """The largest difference between two runs' epoch losses, over the reference's first."""
    if len(run) != len(ref) or not all(math.isfinite(x) for x in run):
        return math.inf
    a, b = training.epochs(run, batches), training.epochs(ref, batches)
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) / max(abs(b[0]), 1e-12)


@dataclass(frozen=True)
class Fp32Runs:
    """The fp32 side of a training check, the same whichever precision is judged against it:
    the batches and their targets, the learning rate fp32 trains steadily at, and the fp32 runs
    (the reference and the band's). Kept per model and measured once, so a second precision
    (bf16 autocast, then oneDNN's bf16 fp32 convs) costs one training run, not four."""

    cfg: PrecisionCheckSettings  # at the learning rate the reference trained steadily at
    batches: list
    targets: list
    runs: dict[str, list[float]]


def fp32_runs(
    workload: Workload,
    device: torch.device,
    mode: Mode,
    cfg: PrecisionCheckSettings,
    seed: int = 0,
    deadline: float | None = None,
) -> Fp32Runs:
    """The reference run, at the largest learning rate (lr, lr/10, lr/100) at which fp32 itself
    trains steadily (at too high a rate, e.g. MobileNetV3-Small with Adam at 1e-3, the loss climbs
    tenfold and every run's gap is noise), and the band's fp32 runs: other batches of the same
    kind (`batch_runs`), jittered inputs (`jitter_runs`)."""
    batches = training.batches_of(workload, cfg.batches, 1000 + 100 * seed)
    targets = training.targets_of(workload, batches, device, mode, cfg, seed)
    rates = (cfg.lr, cfg.lr / 10, cfg.lr / 100)
    for i, lr in enumerate(rates):
        cfg = cfg.model_copy(update={"lr": lr})
        last = i == len(rates) - 1  # taken whatever it does: the check needs a reference
        try:
            ref = training.train(workload, training.REFERENCE, device, batches, targets, cfg, deadline=deadline,
                         probe=not last)  # fmt: skip
        except training.Unsteady:
            continue
        if last or _steady(ref, cfg.batches):
            break
    runs = {"fp32": ref}
    for j in range(cfg.jitter_runs):
        jitter = cfg.jitter * (1 + j)
        runs[f"fp32 jittered {j + 1}"] = training.train(
            workload, training.REFERENCE, device, batches, targets, cfg, jitter, deadline
        )
    for k in range(cfg.batch_runs):
        other = training.batches_of(workload, cfg.batches, 5000 + 100 * seed + 10 * k)
        runs[f"fp32 other batches {k + 1}"] = training.train(
            workload,
            training.REFERENCE,
            device,
            other,
            training.targets_of(workload, other, device, mode, cfg, seed),
            cfg,
            deadline=deadline,
        )
    return Fp32Runs(cfg=cfg, batches=batches, targets=targets, runs=runs)


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
    start = time.perf_counter()
    if mode == "infer":
        return _check_outputs(workload, own_path, precision, device, cfg, seed, start)
    fp32 = fp32_cache.get((seed, cfg)) if fp32_cache is not None else None
    if fp32 is None:
        fp32 = fp32_runs(workload, device, mode, cfg, seed, deadline)
        if fp32_cache is not None:
            fp32_cache[(seed, cfg)] = fp32
    cfg, runs = fp32.cfg, dict(fp32.runs)
    runs[precision] = training.train(workload, own_path, device, fp32.batches, fp32.targets, cfg,
                             deadline=deadline)  # fmt: skip
    ref = runs["fp32"]
    others = [r for name, r in runs.items() if name not in ("fp32", precision)]
    band = max((_gap(r, ref, cfg.batches) for r in others), default=0.0)
    gap = _gap(runs[precision], ref, cfg.batches)
    floor = cfg.resolution * _learnt(ref, cfg.batches)
    accepted = math.isfinite(gap) and gap <= max(cfg.band_factor * band, floor)
    trained = f"{ref[0]:.3g} -> {ref[-1]:.3g} in fp32"
    if accepted:
        head = (
            f"{precision}: trains like fp32 on this model ({cfg.steps} steps at lr {cfg.lr:g}, "
            f"loss {trained}; its largest loss gap "
        )
        summary = head + (
            f"{gap:.1%} of the start, within {cfg.band_factor:g} x the fp32 band {band:.1%})"
            if gap <= cfg.band_factor * band
            else f"{gap:.2%} of the start, within {cfg.resolution:g} x what fp32 learnt "
            f"({floor:.2%}; the fp32 band {band:.2%} is narrower than that)"
        )
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
    return PrecisionCheck(precision=precision, own_path=own_path, mode="train", accepted=accepted,
                          summary=summary, gap=gap, band=band, floor=floor, losses=runs,
                          seconds=time.perf_counter() - start)  # fmt: skip


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
    start: float,
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
                          top1_agreement=top1, seconds=time.perf_counter() - start)  # fmt: skip
