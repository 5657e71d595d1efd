"""The numeric gate: is a candidate's arithmetic what its precision promises, on this model?

Two checks, each where its question is well posed:

1. **Each conv layer alone, against float64.** A conv is linear, so its output and both gradients
   on random inputs are a sharp test of an implementation or a precision: a kernel tap off or a
   weight off by 1e-3 shows at once, whatever the model around it does. Every conv layer of the
   candidate's model is run alone with the input it receives there (shape, dtype, layout, whether
   it needs a gradient), under the candidate's flags and autocast, and compared with the same
   layer in float64; the tolerance per precision is the space's `layer_tolerances`.
2. **The whole model, against the fp32 reference, with a tolerance calibrated on this model.**
   Gradients of a ReLU/BatchNorm network in training jump when a unit near zero flips, so two
   exact-fp32 computations can differ by 1e-6 or 1e-2 depending on the input draw. The yardstick
   is measured on the same inputs: the noise floor is the largest difference from the reference
   among fp32 references with the inputs perturbed by a few roundings (and the float64 answer);
   an fp32-class candidate may differ by the space's `tolerances` / `grad_tolerances`, or by
   `noise_factor` times that floor where that is more (an exact reordering is as good as fp32
   gets). For TF32/fp16/bf16 the yardstick is what PyTorch's own path at that precision (autocast
   or TF32, native kernels, contiguous) differs on this model: the precision is accepted only if
   that is within the space's tolerance (the precision the user accepts), and then a candidate
   may differ by the space's tolerance or `yardstick_factor` times the yardstick, whichever is
   larger (as good as PyTorch's own path at that precision).

NaN or Inf never passes.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from advisor import impls
from advisor.candidate import Candidate, Captured, ConvInput, Mode, to_layout
from advisor.check import global_rel_error, max_rel_error, rel_error
from advisor.device_ops import autocast_type, cuda_ops, placement
from advisor.knobs import Settings, precision_of
from advisor.space import SearchSpace
from advisor.workload import Workload

REFERENCE = Settings(tf32="off")  # fp32 everywhere, native kernels, contiguous
_CACHE_BYTES = 512 * 2**20  # float64 layer references kept for the next candidate (CPU RAM)
_CACHE_SHARE = 0.025  # on a GPU: this share of its memory, up to 2 GiB (a float64 conv on a
_CACHE_MAX = 2 * 2**30  # large layer costs each candidate a second otherwise)


@dataclass(frozen=True)
class Errors:
    """Relative errors of outputs and of all gradients together (None in infer mode)."""

    out: float
    grad: float | None

    def worst(self, other: Errors) -> Errors:
        grad = None if self.grad is None else max(self.grad, other.grad or 0.0)
        return Errors(max(self.out, other.out), grad)


def compare(got: Captured, ref: Captured, mode: Mode) -> Errors:
    return Errors(
        max_rel_error(got.outputs, ref.outputs),
        global_rel_error(got.grads, ref.grads) if mode == "train" else None,
    )


@dataclass(frozen=True)
class Bound:
    """One model-level check (outputs, or all gradients together) and what sets its limit.

    The limit is the larger of the space's tolerance and `factor` x the yardstick: the model's
    fp32 noise floor, or for TF32/fp16/bf16 what PyTorch's own path at that precision differs.
    For those, the precision itself must be acceptable first: PyTorch's own path (`own`) within
    the space's tolerance.
    """

    what: str  # "error" or "gradient error"
    precision: str
    space_key: str  # e.g. "grad_tolerances.fp32"
    space_value: float
    yardstick: float
    factor: float
    own: float | None = None  # PyTorch's own path's error (None for the fp32 class)
    # The own path is PyTorch's default on this device (TF32 convs on CUDA): the user runs it
    # already, so it is accepted whatever it differs; candidates must be as close as it is.
    default_path: bool = False

    @property
    def value(self) -> float:
        return max(self.space_value, self.factor * self.yardstick)

    @property
    def basis(self) -> str:
        if self.factor * self.yardstick <= self.space_value:
            return f"the space's {self.precision} tolerance"
        if self.default_path:
            return (
                f"{self.factor:g} x PyTorch's default path on this device ({self.precision}: "
                f"{self.yardstick:.1e} on this model, accepted as what PyTorch does anyway)"
            )
        if self.own is None:
            return f"{self.factor:g} x this model's fp32 noise floor {self.yardstick:.1e}"
        return f"{self.factor:g} x PyTorch's own {self.precision} path on this model ({self.yardstick:.1e})"

    def judge(self, error: float) -> tuple[str, str] | None:
        """None when `error` passes; else (reason, the `key=value` setting that would accept it)."""
        p = self.precision
        if self.own is not None and self.own > self.space_value and not self.default_path:
            need = max(self.own, error if error > self.factor * self.yardstick else 0.0)
            return (
                f"PyTorch's own {p} path itself differs by {self.own:.2e} ({self.what}) on this "
                f"model, over the {p} tolerance {self.space_value:.1e}: {p} is not accepted here",
                f"{self.space_key}={round_up(need)}",
            )
        if error > self.value:
            return (
                f"{self.what} {error:.2e} over the {p} tolerance {self.value:.1e} ({self.basis})",
                f"{self.space_key}={round_up(error)}",
            )
        return None


@dataclass(frozen=True)
class Tolerance:
    """The model-level checks for one candidate."""

    precision: str
    out: Bound
    grad: Bound | None  # None in infer mode

    @property
    def basis(self) -> str:
        parts = [self.out.basis] + ([self.grad.basis] if self.grad else [])
        return "; ".join(dict.fromkeys(parts))

    def judge(self, errors: Errors) -> tuple[str, str] | None:
        """None when the candidate passes; else (reason, setting that would accept it)."""
        verdict = self.out.judge(errors.out)
        if verdict is None and self.grad is not None and errors.grad is not None:
            verdict = self.grad.judge(errors.grad)
        return verdict


@dataclass(frozen=True)
class LayerVerdict:
    """The worst conv layer of a candidate, checked alone against float64."""

    error: float
    tolerance: float
    layer: str
    what: str  # output, input gradient or weight gradient

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


class Gate:
    """The references every candidate of one workload is judged against (computed once)."""

    def __init__(
        self,
        workload: Workload,
        device: torch.device,
        mode: Mode,
        space: SearchSpace,
        seed: int = 0,
        cudnn_benchmark: bool = False,
    ) -> None:
        self.workload, self.device, self.mode, self.space, self.seed = (
            workload,
            device,
            mode,
            space,
            seed,
        )
        # The cudnn.benchmark value of this process's candidates: the references run with it
        # too, or they would leave cuDNN's plan cache holding the other kind of plan for the
        # same convolutions (`advisor.benchmark_processes`).
        self.cudnn_benchmark = cudnn_benchmark
        self.param_dtype = workload.param_dtype
        # The fp32 answer per shape; the noise floor and the yardsticks are computed when a
        # verdict needs them (most candidates pass on the space's tolerances alone).
        self.cases = [
            self._capture(REFERENCE, case, torch.float32)
            for case in range(len(workload.shape_cases))
        ]
        # Whether the step draws dropout masks: a compiled candidate is captured under the
        # canonical masks only then (Dynamo compiles the model once more for an active mode).
        self.dropout = any(c.dropouts for c in self.cases)
        self._noise: Errors | None = None
        self._yardsticks: dict[str, list[Errors]] = {}
        self._layer_refs: dict[tuple[Any, ...], dict[str, torch.Tensor]] = {}
        self._layer_ref_bytes = 0
        self._cache_bytes = _CACHE_BYTES
        if device.type == "cuda":
            total = cuda_ops().properties(cuda_ops().index_of(device)).total_memory
            self._cache_bytes = min(_CACHE_MAX, int(_CACHE_SHARE * total))

    # ---- references ----------------------------------------------------------------------------

    def _capture(
        self, settings: Settings, case: int, dtype: torch.dtype | None = None, **kw: Any
    ) -> Captured:
        settings = settings.model_copy(update={"cudnn_benchmark": self.cudnn_benchmark})
        cand = Candidate(
            self.workload, settings, self.device, self.mode, self.seed, dtype, case, **kw
        )
        try:
            return cand.capture()
        finally:
            cand.close()

    def noise(self) -> Errors:
        """The largest difference from the fp32 reference among exact-fp32 answers on the same
        inputs (float64, and fp32 with the inputs moved by a few roundings), over every shape."""
        if self._noise is None:
            g = self.space.gate
            worst: Errors | None = None
            for case, ref in enumerate(self.cases):
                others = [self._capture(REFERENCE, case, torch.float64)] + [
                    self._capture(
                        REFERENCE, case, torch.float32, perturb=g.perturbation, perturb_seed=k
                    )
                    for k in range(g.perturbations)
                ]
                for other in others:
                    e = compare(other, ref, self.mode)
                    worst = e if worst is None else worst.worst(e)
            self._noise = worst or Errors(0.0, None if self.mode == "infer" else 0.0)
        return self._noise

    def precision(self, settings: Settings) -> str:
        return precision_of(settings, self.device, self.param_dtype)

    @staticmethod
    def own_path(settings: Settings) -> Settings:
        """PyTorch's own path at the candidate's precision: its autocast or TF32 flags, native
        kernels, contiguous."""
        return Settings(amp=settings.amp, tf32=settings.tf32 if settings.amp == "off" else "conv")

    def _yardstick(self, settings: Settings) -> Errors | None:
        """How far PyTorch's own path at the candidate's precision is from the fp32 reference."""
        if self.precision(settings) == "fp32":
            return None
        own = self.own_path(settings)
        key = own.model_dump_json()
        if key not in self._yardsticks:
            self._yardsticks[key] = [
                compare(self._capture(own, case), ref, self.mode)
                for case, ref in enumerate(self.cases)
            ]
        errs = self._yardsticks[key]
        worst = errs[0]
        for e in errs[1:]:
            worst = worst.worst(e)
        return worst

    def tolerance(self, settings: Settings, errors: Errors | None = None) -> Tolerance:
        """The model-level checks for a candidate with these settings (see `Bound`). Given the
        candidate's `errors`, the noise floor is computed only when they need it: an error within
        the space's tolerance (fp32) or within the yardstick's bound passes without it."""
        precision = self.precision(settings)
        own = self._yardstick(settings)
        default = self.own_path(settings) == Settings()
        zero = Errors(0.0, None if self.mode == "infer" else 0.0)
        tol = self._tolerance(precision, own, zero, default)
        if errors is None or tol.judge(errors) is not None:
            tol = self._tolerance(precision, own, self.noise(), default)
        return tol

    def _tolerance(
        self, precision: str, own: Errors | None, noise: Errors, default: bool = False
    ) -> Tolerance:
        g = self.space.gate
        bounds = []
        for what, key, space_value, floor, own_err in (
            ("error", "tolerances", self.space.tolerances, noise.out, own and own.out),
            ("gradient error", "grad_tolerances", self.space.grad_tolerances, noise.grad,
             own and own.grad),
        ):  # fmt: skip
            bounds.append(
                Bound(
                    what,
                    precision,
                    f"{key}.{precision}",
                    space_value.for_precision(precision),
                    max(floor or 0.0, own_err or 0.0),
                    g.noise_factor if own is None else g.yardstick_factor,
                    None if own is None else (own_err or 0.0),
                    own is not None and default,
                )
            )
        return Tolerance(precision, bounds[0], bounds[1] if self.mode == "train" else None)

    # ---- each conv layer alone -----------------------------------------------------------------

    def check_layers(self, cand: Candidate, convs: list[ConvInput]) -> LayerVerdict | None:
        """The worst conv layer of `cand` run alone against float64 (None: the model has none):
        a failing layer before any passing one, else the largest error.

        At PyTorch's default precision on this device (TF32 convs on CUDA) a layer may differ as
        much as `yardstick_factor` x PyTorch's own kernel for it at that precision: the user runs
        that kernel already (a large-K conv's TF32 error can exceed the space's tolerance)."""
        settings = cand.tuned.settings
        tol = self.space.layer_tolerances.for_precision(self.precision(settings))
        default = self.precision(settings) != "fp32" and self.own_path(settings) == Settings()
        verdicts: list[LayerVerdict] = []
        for c in convs:
            errors = self._layer_errors(cand, c, c.module)
            limit = dict.fromkeys(errors, tol)
            if default and any(err > tol for err in errors.values()):
                native = impls.swap(copy.deepcopy(c.module), "native")
                own = self._layer_errors(cand, c, native)
                factor = self.space.gate.yardstick_factor
                limit = {what: max(tol, factor * own[what]) for what in errors}
            verdicts += [LayerVerdict(err, limit[w], c.name, w) for w, err in errors.items()]
        failing = [v for v in verdicts if not v.ok]
        return max(failing or verdicts, key=lambda v: v.error, default=None)

    def _layer_errors(self, cand: Candidate, c: ConvInput, module: nn.Module) -> dict[str, float]:
        train = self.mode == "train"
        need_x = train and c.requires_grad
        # Drawn where the layer runs, from the same seed for every candidate: on a GPU a CPU
        # draw (and its copy) of a large layer's input and output gradient cost seconds per
        # candidate (gpu_audit #12).
        where = placement(self.device)
        gen = torch.Generator(device=where).manual_seed(self.seed + 17)
        x = torch.randn(c.shape, generator=gen, dtype=torch.float32, device=where).to(c.dtype)
        xd = to_layout(x, c.layout).requires_grad_(need_x)
        params = {
            n: p for n, p in module.named_parameters(recurse=False) if train and p.requires_grad
        }
        with torch.set_grad_enabled(train), cand.tuned.autocast():
            out = module(xd)
        got = {"output": out.detach()}
        g = None
        if train:
            g = torch.randn(out.shape, generator=gen, dtype=torch.float32, device=where)
            g = g.to(out.dtype)
            wrt = [xd] if need_x else []
            grads = torch.autograd.grad(out, [*wrt, *params.values()], g)
            if need_x:
                got["input gradient"] = grads[0]
            for n, gr in zip(params, grads[len(wrt) :], strict=True):
                got[f"param.{n}"] = gr
        ref = self._layer_reference(c, x, g, need_x, list(params))
        errors = {
            "output": rel_error(got["output"], ref["output"]),
        }
        if "input gradient" in got:
            errors["input gradient"] = rel_error(got["input gradient"], ref["input gradient"])
        pgot = {k: v for k, v in got.items() if k.startswith("param.")}
        if pgot:
            pref = {k: ref[k] for k in pgot}
            errors["weight gradient"] = global_rel_error(pgot, pref)
        return errors

    def _layer_reference(
        self,
        c: ConvInput,
        x: torch.Tensor,
        g: torch.Tensor | None,
        need_x: bool,
        params: list[str],
    ) -> dict[str, torch.Tensor]:
        """The layer in float64 with native kernels on the same values (cached, within a budget:
        candidates in one precision share it)."""
        key = (c.name, c.shape, x.dtype, None if g is None else g.dtype, need_x, tuple(params))
        hit = self._layer_refs.get(key)
        if hit is not None:
            return hit
        ref_mod = impls.swap(copy.deepcopy(c.module), "native").to(torch.float64)
        x64 = x.to(placement(self.device), torch.float64).requires_grad_(need_x)
        autocast_off = torch.autocast(autocast_type(self.device), enabled=False)
        with autocast_off, torch.set_grad_enabled(g is not None):
            out = ref_mod(x64)
        ref = {"output": out.detach()}
        if g is not None:
            named = dict(ref_mod.named_parameters(recurse=False))
            wrt = ([x64] if need_x else []) + [named[n] for n in params]
            grads = torch.autograd.grad(out, wrt, g.to(out.device, torch.float64))
            if need_x:
                ref["input gradient"] = grads[0]
            for n, gr in zip(params, grads[1 if need_x else 0 :], strict=True):
                ref[f"param.{n}"] = gr
        size = sum(t.numel() * t.element_size() for t in ref.values())
        if self._layer_ref_bytes + size <= self._cache_bytes:
            self._layer_refs[key] = ref
            self._layer_ref_bytes += size
        return ref


def round_up(x: float) -> str:
    """`x` rounded up to two significant digits, for a setting that accepts it."""
    if x <= 0 or not math.isfinite(x):
        return f"{x:g}"
    exp = math.floor(math.log10(x)) - 1
    return f"{math.ceil(x / 10**exp) * 10**exp:.2g}"


def _max(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    return max(a, b)
