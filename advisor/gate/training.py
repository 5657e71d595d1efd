"""The training check's task and its runs: fixed batches drawn like the example inputs, a
teacher's targets (the same model with its parameters moved), and `steps` optimiser steps of a
model under one candidate's settings, recorded as a loss per step and, at the end, the trained
weights' mean loss over the batches computed in fp32.

That last loss is what the check judges (`advisor.gate.precision`): the weights a precision
trained, not the losses its own forward reported. Under autocast the weights stay fp32 and are
rounded at each forward; at a rate where an Adam step is below the precision's half-ulp of the
weights (bf16 on ResNet-50 at lr 1e-4), the forward sees each update only in part and its losses
lag for a reason that is not training. A precision that cannot carry the model's
signal still fails in fp32: the weights it trained did not learn (tests/data/below_bf16.py).

Batch `b` is always run with the dropout masks of seed `b` (`canonical_dropout`): the teacher's
targets, every training step on it and the losses before and after training. With a mask of its
own at each step a model with dropout cannot learn the task: under other masks than its targets',
MobileNetV3-Small's teacher itself is 0.24-0.43 of the way from its own targets, a floor and a
noise as large as most of what the check measures.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from advisor.apply import apply_settings
from advisor.device.ops import placement
from advisor.knobs import Settings
from advisor.measure.candidate import Mode, flatten_tensors, perturbed
from advisor.measure.canonical_dropout import canonical_dropout
from advisor.measure.seeded import seeded
from advisor.measure.stop import Stop
from advisor.measure.updates import Adam
from advisor.measure.verdict import PrecisionCheckSettings
from advisor.workload.build import Workload

__all__ = [
    "REFERENCE",
    "STEADY",
    "CheckOutOfTime",
    "Unsteady",
    "Weights",
    "batches_of",
    "judged_in_fp32",
    "judged_weights",
    "start_loss",
    "targets_of",
    "train",
]


# A trained model's weights (its state dict, on the CPU).
Weights = dict[str, torch.Tensor]

REFERENCE = Settings(tf32="off")  # the gate's reference: fp32, native kernels, contiguous
# A run is steady while no pass through the batches has a mean loss above this x the start.
STEADY = 1.1


class CheckOutOfTime(Exception):
    """The run's time budget ran out before the check finished: the precision is not judged (a
    candidate at it is stopped, not accepted or rejected, and a later run checks it again)."""

    def __str__(self) -> str:
        return Stop(kind="out_of_time").text()


class Unsteady(Exception):
    """A learning-rate probe's run that has already shown it is not steady: its losses so far."""

    def __init__(self, losses: list[float]) -> None:
        super().__init__("not steady")
        self.losses = losses


def in_time(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() >= deadline:
        raise CheckOutOfTime


def batches_of(workload: Workload, n: int, first_seed: int) -> list[tuple[tuple, dict]]:
    """`n` fixed batches drawn like the example inputs (on the CPU)."""
    cpu = torch.device("cpu")
    return [workload.make_call(cpu, first_seed + b) for b in range(n)]


def teacher_of(workload: Workload, noise: float, seed: int) -> torch.nn.Module:
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


def call_model(
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
    with seeded(seed), canonical_dropout(seed), tuned.autocast():
        return flatten_tensors(tuned.model(*pos, **kw))


def targets_of(
    workload: Workload,
    batches: list,
    device: torch.device,
    mode: Mode,
    cfg: PrecisionCheckSettings,
    seed: int = 0,
) -> list[list[torch.Tensor]]:
    teacher = teacher_of(workload, cfg.teacher_noise, seed=4242 + seed)
    teacher.train(mode == "train")
    tuned = apply_settings(REFERENCE, teacher, device, training=False, warn=False)
    try:
        with torch.no_grad():
            return [
                [o.detach().float() for o in call_model(tuned, a, k, 0.0, b)]
                for b, (a, k) in enumerate(batches)
            ]
    finally:
        tuned.restore()


def loss_of(outs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor:
    """Relative squared error to the targets, summed over outputs (about 1 at the start)."""
    total = torch.zeros((), device=targets[0].device)
    for o, t in zip(outs, targets, strict=True):
        spread = (t - t.mean()).pow(2).sum().clamp_min(1e-12)
        total = total + (o.float() - t).pow(2).sum() / spread
    return total


def mean_loss(
    tuned: Any, device: torch.device, batches: list, targets: list, jitter: float = 0.0
) -> float:
    """The mean loss over the batches, each under its own dropout masks, without a step."""
    with torch.no_grad():
        losses = [
            float(loss_of(call_model(tuned, a, k, jitter, b), [x.to(placement(device)) for x in t]))
            for b, ((a, k), t) in enumerate(zip(batches, targets, strict=True))
        ]
    return sum(losses) / len(losses)


def start_loss(
    workload: Workload, device: torch.device, batches: list, targets: list[list[torch.Tensor]]
) -> float:
    """The task's starting loss: the untrained model's mean loss over the batches, in fp32 and
    training mode (what each batch's first step sees). Gaps, bands and what fp32 learnt are
    fractions of it: a pass's mean is not a start."""
    model = workload.make_model()
    model.train()
    return judged_in_fp32(model, device, batches, targets)


def epochs(losses: list[float], batches: int) -> list[float]:
    """The mean loss over each pass through the batches (then the final loss): a loss per step
    swings with its batch, which is not what a precision changes."""
    steps, final = losses[:-1], losses[-1:]
    return [sum(steps[i : i + batches]) / len(steps[i : i + batches])
            for i in range(0, len(steps), batches)] + final  # fmt: skip


def unsteady(steps: list[float], batches: int, start: float) -> bool:
    """Whether the passes so far (step losses, whole passes only) already break steadiness: one
    pass's mean loss above `STEADY` x the starting loss."""
    e = epochs([*steps, 0.0], batches)[:-1]  # 0.0: a stand-in for the final loss, dropped
    return any(not math.isfinite(x) or x > STEADY * start for x in e)


def train(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    batches: list,
    targets: list[list[torch.Tensor]],
    cfg: PrecisionCheckSettings,
    jitter: float = 0.0,
    deadline: float | None = None,
    probe: float | None = None,
    keep: list[Weights] | None = None,
) -> list[float]:
    """The training loss at each step, then the trained weights' mean loss over the batches,
    computed in fp32 (`judged_in_fp32`; for fp32 itself the same as in its own run). A `probe`
    (is this learning rate steady? the starting loss) raises `Unsteady` at the first pass through
    the batches whose mean loss shows it is not (`unsteady`): the rest of the run cannot change
    that. `keep` receives the trained weights (on the CPU), for a look on held-out batches
    later (`advisor.gate.held_out`)."""
    model = workload.make_model()
    model.train()
    tuned = apply_settings(settings, model, device, training=True, warn=False)
    try:
        params = [p for p in tuned.model.parameters() if p.requires_grad]
        scaler = tuned.scaler
        # Without a GradScaler, Adam as torch.optim computes it, without its import
        # (`advisor.measure.updates`): a check in an eager run is then not its first use.
        opt: Any = (Adam(params, cfg.lr) if scaler is None and Adam.handles(params)
                    else torch.optim.Adam(params, lr=cfg.lr))  # fmt: skip
        if scaler is not None:
            steady_scale(tuned, scaler, params, batches[0], targets[0], device, workload)
        losses = []
        for step in range(cfg.steps):
            in_time(deadline)
            b = step % len(batches)
            args, kwargs = batches[b]
            target = [t.to(placement(device)) for t in targets[b]]
            loss = loss_of(call_model(tuned, args, kwargs, jitter, b, workload.input_grad), target)
            losses.append(float(loss.detach()))
            if not math.isfinite(losses[-1]):
                if probe is not None:
                    raise Unsteady(losses)
                return losses  # diverged: nothing after it means anything
            whole = len(losses) % len(batches) == 0
            if probe is not None and whole and unsteady(losses, len(batches), probe):
                raise Unsteady(losses)
            opt.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
    finally:
        tuned.restore()
    losses.append(judged_in_fp32(tuned.module, device, batches, targets, jitter))
    if keep is not None:
        keep.append(
            {k: v.detach().to("cpu", copy=True) for k, v in tuned.module.state_dict().items()}
        )
    return losses


def judged_weights(
    workload: Workload, weights: Weights, device: torch.device, batches: list, targets: list
) -> float:
    """Trained weights' mean loss over other batches, in fp32 (`judged_in_fp32`)."""
    model = workload.make_model()
    model.load_state_dict(weights)
    model.train()
    return judged_in_fp32(model, device, batches, targets)


def judged_in_fp32(
    model: torch.nn.Module, device: torch.device, batches: list, targets: list, jitter: float = 0.0
) -> float:
    """Trained weights' mean loss over the batches in fp32 (the reference's settings), whatever
    precision trained them: what they learnt, not what the precision's forward makes of them."""
    tuned = apply_settings(REFERENCE, model, device, training=True, warn=False)
    try:
        return mean_loss(tuned, device, batches, targets, jitter)
    finally:
        tuned.restore()


def steady_scale(
    tuned: Any,
    scaler: Any,
    params: list[Any],
    batch: tuple,
    target: list,
    device: Any,
    workload: Workload,
) -> None:
    """Back a fresh GradScaler off to the scale a long run steadies at before the check's steps:
    it starts at 2**16 and skips the steps that overflow, halving each time, which in thousands of
    steps costs nothing but in a short check would show as lag, not as what fp16 does."""
    args, kwargs = batch
    for _ in range(24):
        outs = call_model(tuned, args, kwargs, 0.0, 0, workload.input_grad)
        loss = loss_of(outs, [t.to(placement(device)) for t in target])
        scaler.scale(loss).backward()
        finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in params)
        for p in params:
            p.grad = None
        if finite:
            return
        scaler.update(float(scaler.get_scale()) / 2)
