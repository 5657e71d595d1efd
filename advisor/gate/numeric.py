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

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from advisor.gate.layer import LayerCheck, LayerVerdict
from advisor.gate.metrics import global_rel_error, max_rel_error
from advisor.gate.precision import Fp32Runs, check_precision
from advisor.gate.training import REFERENCE
from advisor.knobs import Settings, precision_of
from advisor.measure.candidate import Candidate, Captured, ConvInput, Mode
from advisor.measure.results import Rejection
from advisor.measure.verdict import (
    PrecisionCheck,
    PrecisionCheckSettings,
    judged,
    own_path,
    path_name,
    round_up,
)
from advisor.space import SearchSpace
from advisor.workload.build import Workload


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
    For those, the precision itself must be acceptable first: `check`, what it does to training
    on this model (`advisor.gate.precision`), or PyTorch's default on the device.
    """

    what: str  # "error" or "gradient error"
    precision: str
    space_key: str  # e.g. "grad_tolerances.fp32"
    space_value: float
    yardstick: float
    factor: float
    own: float | None = None  # PyTorch's own path's error (None for the fp32 class)
    check: PrecisionCheck | None = None  # how the precision was judged (None: fp32 class)

    @property
    def value(self) -> float:
        return max(self.space_value, self.factor * self.yardstick)

    @property
    def basis(self) -> str:
        if self.factor * self.yardstick <= self.space_value:
            return f"the space's {self.precision} tolerance"
        if self.own is None:
            return f"{self.factor:g} x this model's fp32 noise floor {self.yardstick:.1e}"
        if self.check is not None and self.check.own_path == Settings():
            return (
                f"{self.factor:g} x PyTorch's default path on this device ({self.precision}: "
                f"{self.yardstick:.1e} on this model, accepted as what PyTorch does anyway)"
            )
        return f"{self.factor:g} x PyTorch's own {self.precision} path on this model ({self.yardstick:.1e})"

    def judge(self, error: float) -> tuple[Rejection, str, str] | None:
        """None when `error` passes; else (its kind, reason, the `key=value` setting that would
        accept it, or "" when none would)."""
        p, check = self.precision, self.check
        if check is not None and not check.accepted:
            return check.rejection()
        if error > self.value:
            return (
                "tolerance",
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

    def judge(self, errors: Errors) -> tuple[Rejection, str, str] | None:
        """None when the candidate passes; else (its kind, reason, setting that would accept it)."""
        verdict = self.out.judge(errors.out)
        if verdict is None and self.grad is not None and errors.grad is not None:
            verdict = self.grad.judge(errors.grad)
        return verdict


class References:
    """The fp32 reference's answer per shape case, each captured when first read: its length
    is known before any is computed."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._got: dict[int, Captured] = {}

    def __len__(self) -> int:
        return len(self._gate.workload.shape_cases)

    def __getitem__(self, i: int) -> Captured:
        if i not in self._got:
            self._got[i] = self._gate._capture(REFERENCE, i, torch.float32)
        return self._got[i]

    def __iter__(self) -> Iterator[Captured]:
        return (self[i] for i in range(len(self)))

    def load(self) -> None:
        """Capture every shape's reference now."""
        for _ in self:
            pass


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
        self.workload, self.device, self.mode = workload, device, mode
        self.space, self.seed = space, seed
        # The cudnn.benchmark value of this process's candidates: the references run with it
        # too, or they would leave cuDNN's plan cache holding the other kind of plan for the
        # same convolutions (`advisor.execute.benchmark_processes`).
        self.cudnn_benchmark = cudnn_benchmark
        # The fp32 answer per shape: computed now, with no candidate alive beside it (its memory
        # is a model's more), except in cudnn.benchmark's process. There the references'
        # convolutions would be searched before the twins' first calls, which would then read
        # cached plans instead of the search a fresh process pays: that process computes them
        # once the twins' first calls are taken (`execute.first_calls`), or at the first verdict
        # that reads them. The noise floor and the yardsticks are computed when a verdict needs
        # them (most candidates pass on the space's tolerances alone).
        self.unbilled_s = 0.0  # its captures' seconds no verdict has counted (`gating.verdict`)
        self.cases = References(self)
        if not cudnn_benchmark:
            self.cases.load()
        self._noise = Errors(0.0, None if mode == "infer" else 0.0)  # of the answers taken
        self._noise_taken = 0  # how many of its answers are in it (`noise`)
        self._yardsticks: dict[str, list[Errors]] = {}
        self._checks: dict[str, PrecisionCheck] = {}  # own path's JSON -> its verdict
        # the training checks' shared fp32 side, per (seed, check settings)
        self._fp32_runs: dict[tuple[int, PrecisionCheckSettings], Fp32Runs] = {}
        self.layers = LayerCheck(self)

    @property
    def dropout(self) -> bool:
        """Whether the step draws dropout masks: a compiled candidate is captured under the
        canonical masks only then (Dynamo compiles the model once more for an active mode)."""
        return any(c.dropouts for c in self.cases)

    # ---- references ----------------------------------------------------------------------------

    def _capture(
        self, settings: Settings, case: int, dtype: torch.dtype | None = None, **kw: Any
    ) -> Captured:
        began = time.perf_counter()
        settings = settings.model_copy(update={"cudnn_benchmark": self.cudnn_benchmark})
        cand = Candidate(
            self.workload, settings, self.device, self.mode, self.seed, dtype, case, **kw
        )
        try:
            return cand.capture()
        finally:
            cand.close()
            self.unbilled_s += time.perf_counter() - began

    def noise(self, enough: Callable[[Errors], bool] = lambda _: False) -> Errors:
        """The largest difference from the fp32 reference among exact-fp32 answers on the same
        inputs, over every shape: fp32 with the inputs moved by a few roundings, then float64 (a
        CPU has no fast float64 kernels). They are computed one at a time, each once, until the
        largest so far is `enough`: it can only grow, so a verdict it gives stands."""
        g = self.space.gate
        # every shape's answer with the inputs moved (seed k), then in float64 (k None)
        answers = [(c, k) for k in [*range(g.perturbations), None] for c in range(len(self.cases))]
        while self._noise_taken < len(answers) and not enough(self._noise):
            case, k = answers[self._noise_taken]
            self._noise_taken += 1
            if k is not None:
                moved = self._capture(
                    REFERENCE, case, torch.float32, perturb=g.perturbation, perturb_seed=k
                )
                self._noise = self._noise.worst(compare(moved, self.cases[case], self.mode))
                continue
            # A model that cannot run in float64 (QAT's fake quantisation is float32 only): the
            # perturbed fp32 answers alone give the spread.
            with contextlib.suppress(RuntimeError):
                exact = self._capture(REFERENCE, case, torch.float64)
                self._noise = self._noise.worst(compare(exact, self.cases[case], self.mode))
        return self._noise

    def precision(self, settings: Settings) -> str:
        return precision_of(settings, self.device, self.workload.param_dtype)

    own_path = staticmethod(own_path)

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
        return functools.reduce(Errors.worst, self._yardsticks[key])

    def tolerance(
        self, settings: Settings, errors: Errors | None = None, deadline: float | None = None
    ) -> Tolerance:
        """The model-level checks for a candidate with these settings (see `Bound`). Given its
        `errors`, the yardstick and the noise floor (which only raise the space's tolerance) are
        measured only where an error over it needs them: the yardstick before the training check
        (cudnn.benchmark's process runs the flag first), the floor after it for an accepted
        precision, until the candidate passes. A check stops at `deadline` (`CheckOutOfTime`)."""
        precision = self.precision(settings)
        zero = Errors(0.0, None if self.mode == "infer" else 0.0)
        own = None if precision == "fp32" else zero  # the yardstick: measured only where needed
        if errors is None or self._tolerance(precision, own, zero, None).judge(errors) is not None:
            own = self._yardstick(settings)
        check = self.precision_check(settings, deadline)
        tol = self._tolerance(precision, own, zero, check)
        verdict = None if errors is None else tol.judge(errors)
        if errors is None or (verdict is not None and verdict[0] == "tolerance"):
            def accepts(noise: Errors) -> bool:
                bound = self._tolerance(precision, own, noise, check)
                return errors is not None and bound.judge(errors) is None

            tol = self._tolerance(precision, own, self.noise(accepts), check)
        return tol

    # ---- whether a precision is acceptable on this model ---------------------------------------

    def know(self, checks: Iterable[PrecisionCheck]) -> None:
        """Verdicts measured elsewhere (another process, an earlier run of the study): not
        measured again here."""
        for check in checks:
            if check.mode == self.mode:
                self._checks.setdefault(check.own_path.model_dump_json(), check)

    @property
    def checks(self) -> list[PrecisionCheck]:
        return list(self._checks.values())

    def judged(self, settings: Settings) -> bool:
        """Whether the candidate's precision needs no training check here: the fp32 class,
        PyTorch's default on the device, or a precision judged already."""
        return judged(self.precision(settings), settings, (c.own_path for c in self.checks))

    def precision_check(
        self, settings: Settings, deadline: float | None = None
    ) -> PrecisionCheck | None:
        """How the candidate's precision is judged on this model: None for the fp32 class; PyTorch's
        default on the device (TF32 convs on CUDA) is accepted as what the user runs anyway; any
        other is measured once (`advisor.gate.precision`) and kept."""
        precision = self.precision(settings)
        if precision == "fp32":
            return None
        own = self.own_path(settings)
        key = own.model_dump_json()
        if key not in self._checks:
            if own == Settings():
                self._checks[key] = PrecisionCheck(
                    precision=precision, own_path=own, mode=self.mode, accepted=True, gap=0.0,
                    band=0.0, summary=f"{precision}: PyTorch's default on this device, accepted "
                    "as what PyTorch does anyway",
                )  # fmt: skip
            else:
                self._checks[key] = check_precision(self.workload, own, path_name(own, precision),
                                                    self.device, self.mode,
                                                    self.space.precision_check, self.seed,
                                                    deadline, self._fp32_runs)  # fmt: skip
        return self._checks[key]

    def _tolerance(
        self, precision: str, own: Errors | None, noise: Errors, check: PrecisionCheck | None
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
                    check,
                )
            )
        return Tolerance(precision, bounds[0], bounds[1] if self.mode == "train" else None)

    def check_layers(self, cand: Candidate, convs: list[ConvInput]) -> LayerVerdict | None:
        """The worst conv layer of `cand` run alone against float64 (`advisor.gate.layer`); None
        for the reference's own arithmetic (`is_reference`)."""
        if self.is_reference(cand.tuned.settings):
            return None
        return self.layers.check(cand, convs)

    def is_reference(self, settings: Settings) -> bool:
        """Whether a candidate computes as the fp32 reference does (PyTorch's default on a CPU):
        fp32, native kernels, contiguous, whatever cudnn.benchmark and (off a GPU) TF32 say. Its
        layers are not checked against float64: that would judge PyTorch's fp32 kernels, which
        the user runs already and every candidate is measured against, not a change, and pay
        float64 references no other fp32 candidate needs."""
        same = settings.model_copy(update={"cudnn_benchmark": False, "tf32": "off"})
        return self.precision(settings) == "fp32" and same == REFERENCE
