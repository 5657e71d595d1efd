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
from typing import Any

import torch

from advisor.apply import apply_settings
from advisor.device.ops import placement
from advisor.knobs import Settings
from advisor.measure.candidate import Mode, flatten_tensors, perturbed
from advisor.measure.canonical_dropout import canonical_dropout
from advisor.measure.verdict import OUT_OF_TIME, PrecisionCheck, PrecisionCheckSettings
from advisor.workload.build import Workload

__all__ = ["Fp32Runs", "PrecisionCheck", "PrecisionCheckSettings", "check_precision", "fp32_runs"]

REFERENCE = Settings(tf32="off")  # fp32 everywhere (the gate's reference)


class CheckOutOfTime(Exception):
    """The run's time budget ran out before the check finished: the precision is not judged (a
    candidate at it is stopped, not accepted or rejected, and a later run checks it again)."""

    def __str__(self) -> str:
        return OUT_OF_TIME


class _Unsteady(Exception):
    """A learning-rate probe's run that has already shown it is not steady."""


def _in_time(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() >= deadline:
        raise CheckOutOfTime


def _batches(workload: Workload, n: int, first_seed: int) -> list[tuple[tuple, dict]]:
    """`n` fixed batches drawn like the example inputs (on the CPU)."""
    cpu = torch.device("cpu")
    return [workload.make_call(cpu, first_seed + b) for b in range(n)]


def _teacher(workload: Workload, noise: float, seed: int) -> torch.nn.Module:
    """The model with each floating parameter moved by `noise` x its RMS: a function the model
    can learn, with outputs at its own scale."""
    model = workload.make_model()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                rms = p.detach().float().pow(2).mean().sqrt().clamp_min(1e-3)
                p.add_(noise * rms * torch.randn(p.shape, generator=gen).to(p.dtype))
    return model


def _call(
    tuned: Any, args: tuple, kwargs: dict, jitter: float, seed: int, grads: tuple[bool, ...] = ()
) -> list[torch.Tensor]:
    """The model on one batch (moved by `jitter`), dropout masks from `seed`; inputs that need a
    gradient inside the network (`grads`: a layer's input is an activation) get one."""
    inputs = (*args, *kwargs.values())
    if jitter:
        inputs = perturbed(inputs, jitter, seed)
    prepared = tuned.inputs(*inputs)
    for x, grad in zip(prepared, grads, strict=False):
        if grad and torch.is_tensor(x) and x.is_floating_point():
            x.requires_grad_(True)
    pos, kw = prepared[: len(args)], dict(zip(kwargs, prepared[len(args) :], strict=True))
    with canonical_dropout(seed), tuned.autocast():
        return flatten_tensors(tuned.model(*pos, **kw))


def _targets(
    workload: Workload,
    batches: list,
    device: torch.device,
    mode: Mode,
    cfg: PrecisionCheckSettings,
    seed: int = 0,
) -> list[list[torch.Tensor]]:
    teacher = _teacher(workload, cfg.teacher_noise, seed=4242 + seed)
    teacher.train(mode == "train")
    tuned = apply_settings(REFERENCE, teacher, device, training=False, warn=False)
    try:
        with torch.no_grad():
            return [[o.detach().float() for o in _call(tuned, a, k, 0.0, 0)] for a, k in batches]
    finally:
        tuned.restore()


def _loss(outs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor:
    """Relative squared error to the targets, summed over outputs (about 1 at the start)."""
    total = torch.zeros((), device=targets[0].device)
    for o, t in zip(outs, targets, strict=True):
        spread = (t - t.mean()).pow(2).sum().clamp_min(1e-12)
        total = total + (o.float() - t).pow(2).sum() / spread
    return total


def _train(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    batches: list,
    targets: list[list[torch.Tensor]],
    cfg: PrecisionCheckSettings,
    jitter: float = 0.0,
    deadline: float | None = None,
    probe: bool = False,
) -> list[float]:
    """The training loss at each step, then on every batch after the last step. A `probe` (is
    this learning rate steady?) raises `_Unsteady` at the first pass through the batches whose
    mean loss shows it is not (`_unsteady`): the rest of the run cannot change that."""
    model = workload.make_model()
    model.train()
    tuned = apply_settings(settings, model, device, training=True, warn=False)
    try:
        params = [p for p in tuned.model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=cfg.lr)
        scaler = tuned.scaler
        if scaler is not None:
            _settle_scale(tuned, scaler, params, batches[0], targets[0], device, workload)
        losses = []
        for step in range(cfg.steps):
            _in_time(deadline)
            args, kwargs = batches[step % len(batches)]
            target = [t.to(placement(device)) for t in targets[step % len(batches)]]
            loss = _loss(_call(tuned, args, kwargs, jitter, step, workload.input_grad), target)
            losses.append(float(loss.detach()))
            if not math.isfinite(losses[-1]):
                if probe:
                    raise _Unsteady
                return losses  # diverged: nothing after it means anything
            if probe and len(losses) % len(batches) == 0 and _unsteady(losses, len(batches)):
                raise _Unsteady
            opt.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        with torch.no_grad():
            final = [
                float(
                    _loss(
                        _call(tuned, a, k, jitter, 10_000 + i), [x.to(placement(device)) for x in t]
                    )
                )
                for i, ((a, k), t) in enumerate(zip(batches, targets, strict=True))
            ]
        losses.append(sum(final) / len(final))
        return losses
    finally:
        tuned.restore()


def _settle_scale(
    tuned: Any,
    scaler: Any,
    params: list[Any],
    batch: tuple,
    target: list,
    device: Any,
    workload: Workload,
) -> None:
    """Back a fresh GradScaler off to the scale a long run settles at before the check's steps:
    it starts at 2**16 and skips the steps that overflow, halving each time, which in thousands of
    steps costs nothing but in a short check would show as lag, not as what fp16 does."""
    args, kwargs = batch
    for _ in range(24):
        outs = _call(tuned, args, kwargs, 0.0, 0, workload.input_grad)
        loss = _loss(outs, [t.to(placement(device)) for t in target])
        scaler.scale(loss).backward()
        finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in params)
        for p in params:
            p.grad = None
        if finite:
            return
        scaler.update(float(scaler.get_scale()) / 2)


def _epochs(losses: list[float], batches: int) -> list[float]:
    """The mean loss over each pass through the batches (then the final loss): a loss per step
    swings with its batch, which is not what a precision changes."""
    steps, final = losses[:-1], losses[-1:]
    return [sum(steps[i : i + batches]) / len(steps[i : i + batches])
            for i in range(0, len(steps), batches)] + final  # fmt: skip


def _unsteady(steps: list[float], batches: int) -> bool:
    """Whether the passes so far (step losses, whole passes only) already break `_steady`: one
    pass's mean loss above the first's by more than 10%."""
    e = _epochs([*steps, 0.0], batches)[:-1]  # 0.0: a stand-in for the final loss, dropped
    return any(x > 1.1 * e[0] for x in e)


def _steady(losses: list[float], batches: int) -> bool:
    """Whether a run learnt without blowing up: its loss per pass never rose above the first
    pass's by more than 10%, and it ended below where it started."""
    e = _epochs(losses, batches)
    return all(math.isfinite(x) for x in e) and max(e) <= 1.1 * e[0] and e[-1] < e[0]


def _learnt(ref: list[float], batches: int) -> float:
    """What a run learnt: its loss drop from the first pass to the end, over the first pass."""
    e = _epochs(ref, batches)
    return max(0.0, e[0] - e[-1]) / max(abs(e[0]), 1e-12)


def _gap(run: list[float], ref: list[float], batches: int) -> float:
    """The largest difference between two runs' epoch losses, over the reference's first."""
    if len(run) != len(ref) or not all(math.isfinite(x) for x in run):
        return math.inf
    a, b = _epochs(run, batches), _epochs(ref, batches)
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
    batches = _batches(workload, cfg.batches, 1000 + 100 * seed)
    targets = _targets(workload, batches, device, mode, cfg, seed)
    rates = (cfg.lr, cfg.lr / 10, cfg.lr / 100)
    for i, lr in enumerate(rates):
        cfg = cfg.model_copy(update={"lr": lr})
        last = i == len(rates) - 1  # taken whatever it does: the check needs a reference
        try:
            ref = _train(workload, REFERENCE, device, batches, targets, cfg, deadline=deadline,
                         probe=not last)  # fmt: skip
        except _Unsteady:
            continue
        if last or _steady(ref, cfg.batches):
            break
    runs = {"fp32": ref}
    for j in range(cfg.jitter_runs):
        jitter = cfg.jitter * (1 + j)
        runs[f"fp32 jittered {j + 1}"] = _train(
            workload, REFERENCE, device, batches, targets, cfg, jitter, deadline
        )
    for k in range(cfg.batch_runs):
        other = _batches(workload, cfg.batches, 5000 + 100 * seed + 10 * k)
        runs[f"fp32 other batches {k + 1}"] = _train(
            workload,
            REFERENCE,
            device,
            other,
            _targets(workload, other, device, mode, cfg, seed),
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
    runs[precision] = _train(workload, own_path, device, fp32.batches, fp32.targets, cfg,
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
            return [[o.detach().float().cpu() for o in _call(tuned, a, k, 0.0, 0)]
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
    batches = _batches(workload, cfg.batches, 1000 + 100 * seed)
    ref = _outputs(workload, REFERENCE, device, batches)
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
