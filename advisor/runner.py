"""Run one candidate: apply its settings to a fresh model, time its step, gate its numerics.

Used by the search (in process or in a worker subprocess) and by the benchmarks. The step is what
a training loop does under `advisor.apply`: forward under autocast, and in train mode a backward
from a fixed random output gradient (through the GradScaler when fp16 is chosen).
"""

from __future__ import annotations

import gc
import math
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from advisor.allocator import release_free_heap, settle_cpu_allocator
from advisor.apply import Tuned, apply_settings
from advisor.check import global_rel_error, max_rel_error
from advisor.errors import first_line
from advisor.knobs import Settings, precision_of
from advisor.space import SearchSpace
from advisor.timing import Measurement, TimingPolicy, l2_flusher, measure
from advisor.workload import Workload

Mode = Literal["infer", "train"]
Status = Literal["ok", "rejected", "failed"]


class TrialResult(BaseModel):
    """One measured (or failed) candidate. Stored with its optuna trial."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    settings: Settings
    status: Status
    reason: str | None = None
    measurement: Measurement | None = None
    rel_error: float | None = None  # outputs vs the fp32 reference
    grad_error: float | None = None  # all parameter gradients together (train mode)
    precision: str = "fp32"
    tolerance: float | None = None
    grad_tolerance: float | None = None
    peak_memory_mb: float | None = None
    per_shape: list[Measurement] | None = None  # a shape set: one measurement per shape

    @property
    def median_ms(self) -> float:
        return self.measurement.median_ms if self.measurement else math.inf


def _acc(t: torch.Tensor) -> torch.dtype:
    """The dtype a surrogate loss accumulates in: float64 for the float64 reference, else fp32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def flatten_tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor in a model output (tensor, tuple/list, dict, nested), in a stable order."""
    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out, key=str) for t in flatten_tensors(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in flatten_tensors(item)]
    return []


@dataclass
class Captured:
    outputs: list[torch.Tensor]
    grads: dict[str, torch.Tensor]


class Candidate:
    """A fresh model with settings applied, its inputs, and its step. Call `close()` after."""

    def __init__(
        self,
        workload: Workload,
        settings: Settings,
        device: torch.device,
        mode: Mode,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        case: int = 0,
    ) -> None:
        self.mode = mode
        self.device = device
        self.seed = seed
        model = workload.make_model()
        model.train(mode == "train")
        inputs = workload.make_inputs(device, seed, case)
        if dtype is not None:  # the float64 reference
            model.to(dtype)
            inputs = tuple(
                x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs
            )
        self.tuned: Tuned = apply_settings(
            settings, model, device, training=mode == "train", warn=False
        )
        self.inputs = self.tuned.inputs(*inputs)
        self._grad_outputs: list[torch.Tensor] | None = None

    def _forward(self) -> list[torch.Tensor]:
        with self.tuned.autocast():
            return flatten_tensors(self.tuned.model(*self.inputs))

    def _backward(self, outs: list[torch.Tensor]) -> None:
        """Backward from a fixed random output gradient, via a scalar surrogate loss."""
        if self._grad_outputs is None:
            gen = torch.Generator().manual_seed(self.seed + 1)
            self._grad_outputs = [
                torch.randn(o.shape, generator=gen, dtype=torch.float64).to(self.device, _acc(o))
                for o in outs
            ]
        loss = sum(
            (o.to(g.dtype) * g).sum()
            for o, g in zip(outs, self._grad_outputs, strict=True)
            if o.requires_grad
        )
        if not torch.is_tensor(loss):
            raise RuntimeError("no model output requires grad: nothing to train")
        scaler = self.tuned.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def step(self) -> None:
        if self.mode == "infer":
            with torch.no_grad():
                self._forward()
            return
        self.tuned.model.zero_grad(set_to_none=True)
        self._backward(self._forward())

    def capture(self) -> Captured:
        """One step's outputs and gradients (unscaled), with a fixed seed for dropout."""
        torch.manual_seed(self.seed)
        if self.mode == "infer":
            with torch.no_grad():
                outs = self._forward()
            return Captured([o.detach().to(_acc(o)).clone() for o in outs], {})
        self.tuned.model.zero_grad(set_to_none=True)
        outs = self._forward()
        self._backward(outs)
        scale = self.tuned.scaler.get_scale() if self.tuned.scaler is not None else 1.0
        grads = {
            n: p.grad.detach().to(_acc(p.grad)) / scale
            for n, p in self.tuned.model.named_parameters()
            if p.grad is not None
        }
        return Captured([o.detach().to(_acc(o)).clone() for o in outs], grads)

    def close(self) -> None:
        self.tuned.restore()
        del self.tuned, self.inputs
        if self.device.type == "cuda":
            # Give the next candidate the memory back now (cycles included), not at some later
            # collection. On CPU reference counting frees the tensors, and a full collection in
            # a process with optuna loaded costs ~0.4 s per candidate.
            gc.collect()
            torch.cuda.empty_cache()


@dataclass
class CaseReference:
    """The fp32 answer (TF32 off, native convs, contiguous) for one input shape, and how far that
    answer itself is from float64: the noise floor of the comparison.

    The floor matters for gradients of ReLU/BatchNorm nets: rounding flips units near zero, so
    even two exact-fp32 computations differ there by far more than fp32's epsilon.
    """

    captured: Captured
    out_floor: float
    grad_floor: float


@dataclass
class Reference:
    """What every candidate is checked against: one CaseReference per shape of the workload."""

    cases: list[CaseReference]


def reference(workload: Workload, device: torch.device, mode: Mode, seed: int = 0) -> Reference:
    cases = []
    for case in range(len(workload.shape_cases)):
        captured = []
        for dtype in (None, torch.float64):
            cand = Candidate(workload, Settings(tf32="off"), device, mode, seed, dtype, case)
            try:
                captured.append(cand.capture())
            finally:
                cand.close()
        ref32, ref64 = captured
        cases.append(
            CaseReference(
                ref32,
                max_rel_error(ref32.outputs, ref64.outputs),
                global_rel_error(ref32.grads, ref64.grads),
            )
        )
    return Reference(cases)


def _reset_peak_rss() -> None:
    """Linux: restart the peak-RSS mark (VmHWM) at the current RSS, so the next peak read is this
    trial's own. ru_maxrss cannot be reset, and a spawned worker inherits its parent's."""
    release_free_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def _peak_growth_mb(device: torch.device, rss0: float, mem0: int) -> float:
    """Peak memory since the trial started: CUDA allocations on a GPU, resident memory on CPU."""
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device) - mem0) / 2**20
    return max(0.0, _peak_rss_mb() - rss0)


def combine(measurements: list[Measurement], weights: list[float]) -> Measurement:
    """The weighted-sum step time over a shape set, as samples: sample j is the weighted sum of
    each shape's j-th sample (so the spread reflects every shape's noise)."""
    if len(measurements) == 1:
        return measurements[0]
    n = min(len(m.samples_ms) for m in measurements)
    samples = [
        sum(w * m.samples_ms[j] for m, w in zip(measurements, weights, strict=True))
        for j in range(n)
    ]
    first = [m.first_call_ms for m in measurements]
    return Measurement(
        samples_ms=samples,
        first_call_ms=sum(first) if all(f is not None for f in first) else None,  # type: ignore[misc]
        warmup_runs=min(m.warmup_runs for m in measurements),
    )


def _failed(settings: Settings, reason: str, precision: str, tolerance: float) -> TrialResult:
    return TrialResult(
        settings=settings, status="failed", reason=reason, precision=precision, tolerance=tolerance
    )


def evaluate(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    space: SearchSpace,
    ref: Reference,
    *,
    policy: TimingPolicy | None = None,
    per_layer: bool = False,
    clock: Callable[[], float] | None = None,
) -> TrialResult:
    """Measure and gate one candidate on every shape of the workload.

    Any failure becomes a failed result with its reason. The objective over a shape set is the
    weighted sum of the per-shape medians.
    """
    precision = precision_of(settings, device)
    # A candidate may differ from fp32 by its precision's tolerance, or by a few times what fp32
    # itself differs from float64, whichever is larger.
    tolerance = max(
        space.tolerances.for_precision(precision), 3 * max(c.out_floor for c in ref.cases)
    )
    grad_tolerance = max(
        space.grad_tolerances.for_precision(precision), 3 * max(c.grad_floor for c in ref.cases)
    )
    policy = policy or space.timing.policy()
    settle_cpu_allocator()
    _reset_peak_rss()
    rss0 = _peak_rss_mb()
    mem0 = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        mem0 = torch.cuda.memory_allocated(device)
    peak = 0.0
    per_shape: list[Measurement] = []
    err, grad_err = 0.0, 0.0 if mode == "train" else None
    flush = l2_flusher(device) if per_layer else None
    for case, case_ref in enumerate(ref.cases):
        cand: Candidate | None = None
        try:
            cand = Candidate(workload, settings, device, mode, case=case)
            per_shape.append(measure(cand.step, device, policy, clock=clock, flush=flush))
            # The candidate's own peak: read before the numeric check allocates its copies.
            peak = max(peak, _peak_growth_mb(device, rss0, mem0))
            got = cand.capture()
            err = max(err, max_rel_error(got.outputs, case_ref.captured.outputs))
            if grad_err is not None:
                grad_err = max(grad_err, global_rel_error(got.grads, case_ref.captured.grads))
        except torch.OutOfMemoryError:
            return _failed(settings, "out of memory", precision, tolerance)
        except Exception as e:  # noqa: BLE001 - a broken candidate is a result, not a crash
            return _failed(settings, first_line(e), precision, tolerance)
        finally:
            if cand is not None:
                cand.close()
    status: Status = "ok"
    reason = None
    if not math.isfinite(err) or (grad_err is not None and not math.isfinite(grad_err)):
        status, reason = "rejected", "NaN or Inf in outputs or gradients"
    elif err > tolerance:
        status, reason = (
            "rejected",
            f"error {err:.2e} over the {precision} tolerance {tolerance:.1e}",
        )
    elif grad_err is not None and grad_err > grad_tolerance:
        status, reason = (
            "rejected",
            f"gradient error {grad_err:.2e} over the {precision} tolerance {grad_tolerance:.1e}",
        )
    weights = [c.weight for c in workload.shape_cases]
    return TrialResult(
        settings=settings,
        status=status,
        reason=reason,
        measurement=combine(per_shape, weights),
        per_shape=per_shape if len(per_shape) > 1 else None,
        rel_error=err,
        grad_error=grad_err,
        grad_tolerance=grad_tolerance if mode == "train" else None,
        precision=precision,
        tolerance=tolerance,
        peak_memory_mb=peak,
    )
