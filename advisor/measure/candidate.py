"""One candidate ready to run: a fresh model with settings applied, its inputs, and its step.

The step is what a training loop does under `advisor.apply`: forward under autocast and, in train
mode, a backward from the gradient of a mean-reduced loss (each output's gradient is N(0,1) divided
by its number of elements, the scale a real loss gives), through the GradScaler when fp16 is
chosen, then `scaler.step(opt)` / `scaler.update()` (or `opt.step()`) with an SGD optimizer whose
learning rate is zero: the optimizer's cost is in the step, and the weights never change, so every
step and the numeric gate see the same model. Inputs that need a gradient inside the user's network
(a layer's input is an activation) are created with `requires_grad`, so the data gradient is
computed and timed. The model is called as `model(*inputs, **kwargs)`: positional and keyword
inputs (advisor.workload.model_file's convention), each prepared alike.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.autograd.graph import _engine_run_backward

from advisor.apply import Tuned, apply_settings
from advisor.device.ops import cuda_ops, placement
from advisor.impls import conv_modules
from advisor.knobs import Settings, memory_format_for
from advisor.measure.canonical_dropout import canonical_dropout
from advisor.measure.seeded import seeded
from advisor.measure.updates import ZeroLrSgd
from advisor.workload.build import Workload

Mode = Literal["infer", "train"]
# How often capture() lets a GradScaler skip a step and back off before it gives up: a fresh
# scaler starts at 2**16 and halves per overflow, so 24 reach a scale of 2**-8.
MAX_BACKOFFS = 24


def flatten_tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor in a model output (tensor, tuple/list, dict, nested), in a stable order."""
    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out, key=str) for t in flatten_tensors(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in flatten_tensors(item)]
    if hasattr(out, "__dataclass_fields__"):
        return [
            t for k in sorted(out.__dataclass_fields__) for t in flatten_tensors(getattr(out, k))
        ]
    return []


def engine_grads(outputs: list[torch.Tensor], grads: list[torch.Tensor],
                 inputs: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Backward from `outputs` with `grads` (made from them: same shapes) at autograd's engine
    entry, where `torch.autograd.backward` and `.grad` go after checking them (a sympy import,
    then microseconds a call): into `.grad`, or with `inputs`, returned for each (all used)."""
    wrt = tuple(inputs or ())
    return _engine_run_backward(tuple(outputs), tuple(grads), False, False, wrt,
                                allow_unreachable=not wrt, accumulate_grad=not wrt)  # fmt: skip


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a comparison accumulates in: float64 for the float64 reference, else fp32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def loss_weights(outs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """The timed loss's gradient with respect to each output: N(0,1) / its number of elements,
    a mean-reduced loss's scale, drawn from `seed`. The scale matters on a CPU: gradients that
    small reach subnormal floats in some models' fp32 backward, which is slow there."""
    gen = torch.Generator().manual_seed(seed)
    draws = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    return [(d / max(o.numel(), 1)).to(o.device, acc_dtype(o)) for d, o in zip(draws, outs, strict=True)]


@dataclass
class ConvInput:
    """What one conv layer received in a forward pass: for checking its kernel alone."""

    name: str
    module: nn.Module
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str  # contiguous, channels_last or strided
    requires_grad: bool


@dataclass
class Captured:
    outputs: list[torch.Tensor]
    grads: dict[str, torch.Tensor]  # parameter gradients by name, input gradients as "input.i"
    convs: list[ConvInput] = field(default_factory=list)
    dropouts: int = 0  # dropout masks drawn (by `canonical_dropout`) in the captured step


def layout_of(x: torch.Tensor) -> str:
    if x.is_contiguous():
        return "contiguous"
    fmt = memory_format_for(x.dim(), "channels_last")
    if fmt is not None and x.is_contiguous(memory_format=fmt):
        return "channels_last"
    return "strided"


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    fmt = memory_format_for(x.dim(), layout) if layout != "strided" else None
    return x.contiguous(memory_format=fmt) if fmt is not None else x


def perturbed(inputs: tuple[Any, ...], rel: float, seed: int) -> tuple[Any, ...]:
    """Floating inputs times (1 + rel·z), z ~ N(0,1): a reference as far from the original as a
    few roundings, for the noise floor of the numeric gate."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if torch.is_tensor(x) and x.is_floating_point():
            z = torch.randn(x.shape, generator=gen, dtype=torch.float64)
            x = (x.double() * (1 + rel * z)).to(x.dtype)
        out.append(x)
    return tuple(out)


def _calls(mode: Any) -> int:
    """Dropout masks a `canonical_dropout` drew (0 without one)."""
    return int(getattr(mode, "calls", 0))


# How a layer's training step is timed; stored measurements of layers taken another way are not
# compared with this one's (`per_layer.layer_context`, `study.study_name_for`). 3: backward from
# the output gradient at autograd's engine entry (`Candidate._backward_from_outputs`).
LAYER_STEP = "step3"


class Candidate:
    """A fresh model with settings applied, its inputs, and its step. Call `close()` after.

    `dtype` (float32 or float64) makes a reference: the model and every floating input in that
    dtype (an input a layer receives in bf16 inside the network is cast up exactly). `perturb`
    multiplies the inputs by (1 + perturb·z) (see `perturbed`).
    """

    def __init__(
        self,
        workload: Workload,
        settings: Settings,
        device: torch.device,
        mode: Mode,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        case: int = 0,
        perturb: float = 0.0,
        perturb_seed: int = 0,
        optimizer: bool = True,
    ) -> None:
        self.mode = mode
        self.device = device
        self.seed = seed
        model = workload.make_model()
        model.train(mode == "train")
        args, kwargs = workload.make_call(torch.device("cpu"), seed, case)
        # Positional and keyword inputs are prepared alike, as one sequence (positional first).
        inputs = (*args, *kwargs.values())
        if dtype is not None:
            model.to(dtype)
            inputs = tuple(
                x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs
            )
        if perturb:
            inputs = perturbed(inputs, perturb, 1000 + perturb_seed)
        self.tuned: Tuned = apply_settings(
            settings, model, device, training=mode == "train", warn=False
        )
        # The buffers as built: a captured step starts from them however many timed steps ran
        # before it (each step moves a QAT observer's range, a spectral norm's vectors, and so
        # the next step's answer; a batch norm's running stats change no training step's).
        self._buffers = {n: b.detach().clone() for n, b in self.tuned.module.named_buffers()}
        if workload.input_layout is None:
            prepared = self.tuned.inputs(*inputs)
        else:  # a layer inside a network: its input arrives in the layout recorded there
            prepared = tuple(
                to_layout(x.to(placement(device)), workload.input_layout)
                if torch.is_tensor(x)
                else x
                for x in inputs
            )
        if mode == "train":
            for x, grad in zip(prepared, workload.input_grad, strict=False):
                if grad and torch.is_tensor(x) and x.is_floating_point():
                    x.requires_grad_(True)
        self.inputs = tuple(prepared[: len(args)])
        self.kwargs: dict[str, Any] = dict(zip(kwargs, prepared[len(args) :], strict=True))
        self._grad_outputs: list[torch.Tensor] | None = None
        self._opt: ZeroLrSgd | None = None
        self._params = [p for p in self.tuned.module.parameters() if p.requires_grad]
        # A layer on a GPU is timed with its calls queued ahead: its step must not sync.
        self._sync_free = workload.is_layer and device.type == "cuda"
        # A layer's output feeds the next layer, not a loss (`_backward_from_outputs`).
        self._direct = workload.is_layer
        self._direct_grads: list[torch.Tensor] | None = None
        if mode == "train" and self._params and optimizer:
            # lr=0: the update costs what it costs, and p + 0·g leaves every weight as it was:
            # torch.optim.SGD's update without torch.optim's import of torch._dynamo, a
            # GradScaler's too (`advisor.measure.updates`).
            self._opt = ZeroLrSgd(self._params)

    # ---- the step ----------------------------------------------------------------------------

    def _forward(self) -> list[torch.Tensor]:
        with self.tuned.autocast():
            return flatten_tensors(self.tuned.model(*self.inputs, **self.kwargs))

    def _loss(self, outs: list[torch.Tensor]) -> torch.Tensor:
        """A scalar whose gradient with respect to each output is a fixed random tensor of the
        scale of a mean-reduced loss's (N(0,1) / number of elements)."""
        if self._grad_outputs is None:
            self._grad_outputs = loss_weights(outs, self.seed + 1)
        terms = [
            (o.to(g.dtype) * g).sum()
            for o, g in zip(outs, self._grad_outputs, strict=True)
            if o.requires_grad
        ]
        if not terms:
            raise RuntimeError("no model output requires grad: nothing to train")
        return torch.stack(terms).sum()

    def _named_inputs(self) -> list[tuple[str, Any]]:
        """Every input with its name in the gradients: "input.0", ... and "input.<keyword>"."""
        named = [(f"input.{i}", x) for i, x in enumerate(self.inputs)]
        return named + [(f"input.{k}", x) for k, x in self.kwargs.items()]

    def _zero_grad(self) -> None:
        self.tuned.module.zero_grad(set_to_none=True)
        for _, x in self._named_inputs():
            if torch.is_tensor(x) and x.requires_grad:
                x.grad = None

    def _backward_from_outputs(self, outs: list[torch.Tensor]) -> None:
        """Backward from the outputs, at autograd's engine entry, with `_loss`'s output gradients
        in each output's dtype: the gradients `_loss` gives, bit for bit (its cast back is the
        same rounding). Neither the loss's passes over the output nor `torch.autograd.backward`'s
        checks of the gradients are timed: on a cheap layer they can be over half its step, the
        same for every implementation, which would narrow the ratios."""
        if self._direct_grads is None:
            self._loss(outs)  # draws the output gradients
            assert self._grad_outputs is not None
            self._direct_grads = [g.to(o.dtype) for o, g in zip(outs, self._grad_outputs,
                                                                 strict=True)]  # fmt: skip
        pairs = [(o, g) for o, g in zip(outs, self._direct_grads, strict=True) if o.requires_grad]
        if not pairs:
            raise RuntimeError("no model output requires grad: nothing to train")
        engine_grads([o for o, _ in pairs], [g for _, g in pairs])

    def _train_step(self) -> None:
        """Forward, backward and the optimizer step, as a training loop does them."""
        self._zero_grad()
        scaler = self.tuned.scaler
        if self._direct and scaler is None:
            self._backward_from_outputs(self._forward())
            if self._opt is not None:
                self._opt.step()
            return
        loss = self._loss(self._forward())
        if scaler is None:
            loss.backward()
            if self._opt is not None:
                self._opt.step()
            return
        scaler.scale(loss).backward()
        if self._opt is None:
            return
        if self._sync_free:
            # `scaler.step` reads found-Inf on the host (`.item()`): a per-layer sample, whose
            # calls are queued ahead of a busy GPU, would time the host's launches after it.
            # The same kernels without the sync: unscale, the (lr=0) step on gradients whose
            # Infs are zeroed (it cannot be skipped without reading found-Inf), the update.
            scaler.unscale_(self._opt)
            for p in self._params:
                if p.grad is not None:
                    p.grad.nan_to_num_(0.0, 0.0, 0.0)
            self._opt.step()
            scaler.update()
            return
        scaler.step(self._opt)  # unscales the parameter gradients; skips the step on Inf
        scaler.update()  # backs the scale off after an Inf, as in training

    def step(self) -> None:
        if self.mode == "infer":
            with torch.no_grad():
                self._forward()
            return
        self._train_step()

    # ---- what the gate compares --------------------------------------------------------------

    def capture(self, record_convs: bool = False, canonical: bool = True) -> Captured:
        """One step's outputs and gradients (unscaled), with dropout masks that depend only on the
        seed (`advisor.measure.canonical_dropout`: not on dtype or layout). With an fp16
        GradScaler, a step whose gradients overflow is skipped and the scale backed off, as in
        training, until one is finite (or MAX_BACKOFFS is reached). `record_convs` also records
        what each conv layer received. `canonical=False` runs the step as timed, without the
        dropout mode: for a compiled model on a workload that draws no dropout mask (Dynamo
        traces an active mode and compiles the model again for it; see advisor/compiled.py)."""
        convs: list[ConvInput] = []
        hooks = self._record_convs(convs) if record_convs else []
        try:
            if self.mode == "infer":
                self._restore_buffers()
                with (
                    torch.no_grad(),
                    seeded(self.seed, keep_torch=True),
                    self._dropout_mode(canonical) as mode,
                ):
                    outs = self._forward()
                return Captured([o.detach().to(acc_dtype(o)).clone() for o in outs], {}, convs,
                                _calls(mode))  # fmt: skip
            for _ in range(MAX_BACKOFFS):
                convs.clear()
                self._restore_buffers()
                self._zero_grad()
                # the same units dropped, and the same draws of torch, random and NumPy, in every
                # candidate (torch's left as drawn: the step is the gate's own)
                with seeded(self.seed, keep_torch=True), self._dropout_mode(canonical) as mode:
                    outs = self._forward()
                loss = self._loss(outs)
                scaler = self.tuned.scaler
                grads = self._backward_for_capture(loss, scaler)
                if scaler is None or all(bool(torch.isfinite(g).all()) for g in grads.values()):
                    break
            return Captured([o.detach().to(acc_dtype(o)).clone() for o in outs], grads, convs,
                            _calls(mode))  # fmt: skip
        finally:
            for h in hooks:
                h.remove()

    def _restore_buffers(self) -> None:
        with torch.no_grad():
            for name, b in self.tuned.module.named_buffers():
                saved = self._buffers.get(name)
                if saved is not None and saved.shape == b.shape:
                    b.copy_(saved)
                elif saved is not None:  # an observer's range starts empty, then takes a shape
                    b.data = saved.clone()

    def _dropout_mode(self, canonical: bool) -> contextlib.AbstractContextManager[Any]:
        return canonical_dropout(self.seed) if canonical else contextlib.nullcontext()

    def _backward_for_capture(self, loss: torch.Tensor, scaler: Any) -> dict[str, torch.Tensor]:
        scale = 1.0
        if scaler is None:
            loss.backward()
        else:
            scale = float(scaler.get_scale())
            scaler.scale(loss).backward()
            if self._opt is not None:
                scaler.step(self._opt)  # unscales the parameter gradients in place
                scaler.update()
        param_scale = scale if scaler is not None and self._opt is None else 1.0
        grads = {
            n: p.grad.detach().to(acc_dtype(p.grad)) / param_scale
            for n, p in self.tuned.module.named_parameters()
            if p.grad is not None
        }
        for name, x in self._named_inputs():
            if torch.is_tensor(x) and x.grad is not None:
                grads[name] = x.grad.detach().to(acc_dtype(x.grad)) / scale
        return grads

    def _record_convs(self, out: list[ConvInput]) -> list[Any]:
        def hook(name: str) -> Callable[..., None]:
            def record(module: nn.Module, args: tuple[Any, ...]) -> None:
                x = args[0] if args else None
                if torch.is_tensor(x) and not any(c.name == name for c in out):
                    out.append(
                        ConvInput(
                            name, module, tuple(x.shape), x.dtype, layout_of(x), x.requires_grad
                        )
                    )

            return record

        return [
            m.register_forward_pre_hook(hook(name)) for name, m in conv_modules(self.tuned.module)
        ]

    def close(self) -> None:
        self.tuned.restore()
        del self.tuned, self.inputs, self.kwargs, self._opt
        if self.device.type == "cuda":
            # Give the next candidate the memory back now (cycles included), not at some later
            # collection. On CPU reference counting frees the tensors, and a full collection in
            # a process with optuna loaded costs ~0.4 s per candidate.
            gc.collect()
            cuda_ops().empty_cache()
