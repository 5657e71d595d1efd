"""Whether a reduced precision (bf16, fp16 with its GradScaler, TF32, oneDNN's bf16 fp32 convs)
is acceptable for this model: decided by what it does to training (in infer mode, to the
outputs' information), measured once per precision per model. docs/numeric-gate.md section 3
gives the method, why where training ends decides rather than one step's rounding, the
published tolerances it follows and its limits.

In train mode fp32 and the precision, through PyTorch's own path (autocast, the GradScaler for
fp16, the TF32 or oneDNN flags), each take `steps` Adam steps from the same weights on a task
the model can learn (`advisor.gate.training`), at a rate where fp32 learns it
(`advisor.gate.reference_runs`). The weights each run trained are evaluated in fp32, and the
**gap** is how far the precision's final loss ends behind fp32's, over the start. It is
accepted when its losses stay finite and the gap is within `max_degradation` x what fp32
learnt, or `band_factor` x the **band** (how far fp32 itself ends on other batches); outside
both, on held-out batches by the same two allowances (`advisor.gate.held_out`); outside still,
both runs are trained again, twice as long up to `max_steps`, while the gap closes. It is **not
judged** (so not accepted, and the advice says why) where fp32 did not learn the task, its band
is over `max_band`, or the precision lags at a rate whose Adam step is below `visible_step` x
its half-ulp of the weights.

In infer mode, the precision's output error relative to how much the outputs vary across the
batch must be within `signal_tolerance`, outputs finite; for a classifier-shaped output the
top-1 agreement with fp32 is reported.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from advisor.apply import apply_settings
from advisor.gate import training
from advisor.gate.held_out import held_out
from advisor.gate.reference_runs import Fp32Runs, _fits, final_gap, fp32_runs, learnt
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
    "half_ulp",
]


def significant_bits(own_path: Settings) -> int:
    """Significant bits the precision's path keeps of a weight, the implicit one counted: bf16
    (autocast, oneDNN's bf16 fp32 convs) 8; fp16 and TF32 11."""
    return 8 if "bf16" in (own_path.amp, own_path.cpu_fp32) else 11


def half_ulp(magnitude: float, bits: int) -> float:
    """Half the spacing of representable values at `magnitude` with `bits` significant bits: a
    weight change below it rounds away (bf16 at |w| 0.03: 6.1e-5)."""
    if not magnitude > 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(magnitude)) - bits)


def typical_weight(workload: Workload) -> float:
    """The median |w| of the untrained model's weights that autocast rounds (floating parameters
    of two dimensions or more: conv and linear weights)."""
    weights = [p.detach().abs().float().flatten() for p in workload.make_model().parameters()
               if p.is_floating_point() and p.dim() >= 2]  # fmt: skip
    return float(torch.cat(weights).median()) if weights else 0.0


@dataclass(frozen=True)
class _Horizon:
    """Both runs at one length, and the precision's gap and floor there."""

    steps: int
    ref: list[float]
    run: list[float]
    gap: float
    floor: float  # `max_degradation` x what fp32 learnt


def _at(steps: int, ref: list[float], run: list[float], fp32: Fp32Runs) -> _Horizon:
    start = fp32.start
    return _Horizon(steps, ref, run, final_gap(run, ref, start, start),
                    fp32.cfg.max_degradation * learnt(ref, start))  # fmt: skip


def _lengthen(
    workload: Workload,
    own_path: Settings,
    precision: str,
    device: torch.device,
    fp32: Fp32Runs,
    runs: dict[str, list[float]],
    first: _Horizon,
    deadline: float | None,
) -> _Horizon:
    """Both runs again, twice as long each time up to `max_steps`, while the precision's gap
    closes and stays outside `max_degradation` x what fp32 learnt: the longest horizon measured
    (a run fp32 does not learn steadily over is left out, and the one before is kept)."""
    cfg, now = fp32.cfg, first
    while now.steps * 2 <= cfg.max_steps and now.floor < now.gap < math.inf:
        at = cfg.model_copy(update={"steps": now.steps * 2})
        ref = training.train(workload, training.REFERENCE, device, fp32.batches, fp32.targets, at,
                             deadline=deadline)  # fmt: skip
        if _fits(ref, at.batches, fp32.start, at) != "learns":
            break
        run = training.train(workload, own_path, device, fp32.batches, fp32.targets, at,
                             deadline=deadline)  # fmt: skip
        runs[f"fp32, {at.steps} steps"], runs[f"{precision}, {at.steps} steps"] = ref, run
        longer = _at(at.steps, ref, run, fp32)
        closing = longer.gap < now.gap
        now = longer
        if not closing:
            break
    return now


def _behind(gap: float) -> str:
    where = "behind" if gap >= 0 else "ahead"
    return f"{abs(gap):.2%} of the start {where}"


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
        # a gap within `max_degradation` x what fp32 learnt is accepted whatever the band.
        fp32 = fp32_runs(workload, device, mode, cfg, seed, deadline, band=False)
    run: list[float] | None = None
    kept: list[training.Weights] = []  # the weights `run` trained, for the held-out look
    if fp32.refused is None:
        run = training.train(workload, own_path, device, fp32.batches, fp32.targets, fp32.cfg,
                             deadline=deadline, keep=kept)  # fmt: skip
        first = _at(fp32.cfg.steps, fp32.runs["fp32"], run, fp32)
        if not fp32.banded and not first.gap <= first.floor:
            lr = fp32.cfg.lr
            fp32 = fp32_runs(workload, device, mode, cfg, seed, deadline, probes=fp32.probes,
                             probe_weights=fp32.probe_weights)  # fmt: skip
            if fp32.refused is not None:
                run = None
            elif fp32.cfg.lr != lr:  # fp32's band too wide there: judged at the rate kept
                kept.clear()
                run = training.train(workload, own_path, device, fp32.batches, fp32.targets,
                                     fp32.cfg, deadline=deadline, keep=kept)  # fmt: skip
    if fp32_cache is not None:
        fp32_cache[key] = fp32
    cfg, runs, start, band = fp32.cfg, dict(fp32.runs), fp32.start, fp32.band
    common = dict(precision=precision, own_path=own_path, mode="train", band=band, start=start,
                  lr=cfg.lr)  # fmt: skip
    if fp32.refused is not None or run is None:  # not run: nothing it does could be told
        return PrecisionCheck(**common, accepted=False, judged=False, gap=math.nan, losses=runs,
                              summary=f"{precision}: not judged on this model: {fp32.refused}",
                              seconds=time.perf_counter() - begun)  # fmt: skip
    runs[precision] = run
    first = _at(cfg.steps, runs["fp32"], run, fp32)
    in_band = fp32.banded and first.gap <= cfg.band_factor * band
    lagging = not in_band and math.isfinite(first.gap) and first.gap > first.floor
    look = None
    if lagging and kept:  # maybe memorisation's floor: what generalises (`held_out`)
        training.in_time(deadline)
        look = held_out(workload, device, mode, fp32, kept[-1], seed)
    held = look is not None and look.accepts  # judged at the first horizon, no longer runs
    now = first
    if lagging and not held:
        now = _lengthen(workload, own_path, precision, device, fp32, runs, first, deadline)
    accepted = in_band or held or now.gap <= now.floor
    trained = f"{start:.3g} -> {now.ref[-1]:.3g} in fp32"
    before = (f"; after {first.steps} steps {_behind(first.gap)}" if now.steps != first.steps
              else "")  # fmt: skip
    told = (f"{now.steps} steps at lr {cfg.lr:g}, loss {trained}, {now.run[-1]:.3g} trained in "
            f"{precision} (both evaluated in fp32); it ends {_behind(now.gap)}")  # fmt: skip
    over = (f"over {cfg.max_degradation:g} x what fp32 learnt ({now.floor:.2%}) and "
            f"{cfg.band_factor:g} x the fp32 band {band:.2%}")  # fmt: skip
    if accepted:
        if in_band:
            why = f"within {cfg.band_factor:g} x the fp32 band {band:.2%}"
        elif held and look is not None:
            why = f"{over} on its training batches; {look.text()}: within"
        else:
            why = f"within {cfg.max_degradation:g} x what fp32 learnt ({now.floor:.2%})"
            if not fp32.banded:
                why += "; fp32's band on other batches not run"
        summary = f"{precision}: trains like fp32 on this model ({told}, {why}{before})"
    elif not math.isfinite(now.gap):
        summary = (
            f"{precision}: does not train on this model: its loss became Inf or NaN within "
            f"{now.steps} steps (fp32: {trained})"
        )
    else:
        outside = over + before
        if look is not None:
            outside += f"; {look.text()}: " + ("outside" if look.tells else
                                               "too little learnt there to tell")  # fmt: skip
        blind = _blind(workload, own_path, precision, cfg)
        if blind:  # its lag may be resolution: not measured as training, so not a rejection
            return PrecisionCheck(**common, accepted=False, judged=False, gap=math.nan,
                                  floor=now.floor, losses=runs, steps=now.steps,
                                  summary=f"{precision}: not judged on this model: {blind} ({told}, "
                                  f"{outside})", seconds=time.perf_counter() - begun)  # fmt: skip
        summary = f"{precision}: does not train like fp32 on this model ({told}, {outside})"
    return PrecisionCheck(**common, accepted=accepted, summary=summary, gap=now.gap,
                          floor=now.floor, losses=runs, steps=now.steps,
                          held_out=look.numbers() if look is not None else None,
                          seconds=time.perf_counter() - begun)  # fmt: skip


def _blind(
    workload: Workload, own_path: Settings, precision: str, cfg: PrecisionCheckSettings
) -> str:
    """Why the check cannot tell the precision's training from its resolution at this rate, or
    "": an Adam step (about `lr` per weight) below `visible_step` x its half-ulp of the weights'
    median size."""
    size = typical_weight(workload)
    unit = half_ulp(size, significant_bits(own_path))
    if cfg.lr >= cfg.visible_step * unit:
        return ""
    return (
        f"at lr {cfg.lr:g} an Adam step (about {cfg.lr:.1g} a weight) is below "
        f"{cfg.visible_step:g} x {precision}'s half-ulp of its weights ({unit:.1e} at their median "
        f"size {size:.2g}): its forward sees each update only in part, so its lag is resolution "
        "as much as training"
    )


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
