"""Training-start application of settings: flags, memory format, conv implementations, AMP.

This module (and `advisor.apply`) imports neither optuna nor pandas: applying a tuned config at
training start costs a JSON read. The search times candidates through `apply_settings` too, so what
was measured is exactly what is applied.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from advisor import impls
from advisor.compiled import compile_model
from advisor.config import Config, load_config
from advisor.device.allocator import keep_cpu_buffers_resident
from advisor.device.environment import current_environment, resolve_device
from advisor.device.ops import autocast_type, cuda_ops, placement
from advisor.errors import first_line
from advisor.knobs import GlobalFlags, Settings, memory_format_for

_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class AdvisorWarning(UserWarning):
    """Something in a config could not be applied as written, or was tuned elsewhere."""


class Tuned:
    """A model with settings applied. Use `with tuned.autocast():` around each step.

    `model` is what to call: the compiled model when the settings compile (`torch.compile`),
    else `module`, the model itself with its layout and conv swaps (its `state_dict` keys are the
    model's own: save checkpoints from it; a compiled model's carry an `_orig_mod.` prefix).
    `scaler` is a GradScaler when fp16 autocast is chosen for training, else None.
    `restore()` puts PyTorch's global flags back as they were before.
    """

    def __init__(
        self,
        model: nn.Module,
        settings: Settings,
        device: torch.device,
        flags: GlobalFlags,
        layer_impls: dict[str, str],
        scaler: Any | None,
        module: nn.Module | None = None,
    ) -> None:
        self.model = model
        self.module = module if module is not None else model
        self.settings = settings
        self.device = device
        self.layer_impls = layer_impls  # what each conv layer actually runs with
        self.scaler = scaler
        self._flags = flags

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return _AMP_DTYPES.get(self.settings.amp)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=autocast_type(self.device), dtype=self.amp_dtype)

    def inputs(self, *xs: Any) -> tuple[Any, ...]:
        """Inputs moved to the device in the chosen memory format (other values untouched)."""
        return tuple(_to_format(x, self.device, self.settings.memory_format) for x in xs)

    def restore(self) -> None:
        self._flags.restore()

    def reapply(self) -> None:
        """Set this model's flags again after `restore()` (a candidate kept between two timings:
        `advisor.execute.park`); the next `restore()` puts back the flags found now."""
        self._flags.apply(self.settings, self.device)

    def __enter__(self) -> Tuned:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"Tuned({self.settings.label()} on {self.device})"


def _to_format(x: Any, device: torch.device, memory_format: str) -> Any:
    if not torch.is_tensor(x):
        return x
    x = x.to(placement(device))
    fmt = memory_format_for(x.dim(), memory_format)
    return x.contiguous(memory_format=fmt) if fmt is not None else x


def compute_dtype(module: nn.Module, settings: Settings) -> torch.dtype:
    """The dtype a conv layer computes in under `settings`: the autocast dtype, else its
    weights' dtype (what an implementation's `why_not` is asked about)."""
    if settings.amp in _AMP_DTYPES:
        return _AMP_DTYPES[settings.amp]
    weight = getattr(module, "weight", None)
    return weight.dtype if weight is not None else torch.float32


def plan_layers(
    model: nn.Module, settings: Settings, device: torch.device, *, warn: bool = True
) -> dict[str, str]:
    """Which implementation each conv layer will run with here (name -> impl); changes nothing.

    Everything is decided before any layer is touched: an implementation that is unknown here
    (e.g. a plugin that is not installed) or that cannot run a layer falls back to `native`, with
    an AdvisorWarning naming the layer when `warn` is set (a hand-edited or foreign config).
    Without `warn` (the search measuring a candidate) an unknown implementation is an ImplError,
    raised before anything changes: a candidate is never measured as something else."""
    known = set(impls.names())
    plan: dict[str, str] = {}
    for name, module in impls.conv_modules(model):
        wanted = settings.layers.get(name, settings.conv_impl)
        reason: str | None
        if wanted not in known:
            if not warn:
                impls.get_impl(wanted)  # raises the ImplError naming the known ones
            reason = f"unknown implementation here; known: {', '.join(impls.names())}"
        else:
            try:
                reason = impls.why_not(
                    wanted, module, device=device, dtype=compute_dtype(module, settings)
                )
            except Exception as e:  # noqa: BLE001 - an implementation's own check failed
                reason = f"its check failed: {first_line(e)}"
        if reason is not None:
            if warn and wanted != "native":
                warnings.warn(
                    f"layer {name!r}: {wanted} cannot run here ({reason}); using native",
                    AdvisorWarning,
                    stacklevel=3,
                )
            wanted = "native"
        plan[name] = wanted
    unknown = set(settings.layers) - set(plan)
    if unknown and warn:
        warnings.warn(
            f"config names layers this model does not have: {', '.join(sorted(unknown))}",
            AdvisorWarning,
            stacklevel=3,
        )
    return plan


def swap_planned(model: nn.Module, plan: dict[str, str]) -> None:
    """Swap the layers as `plan_layers` decided, all or none: when one swap fails, the layers
    swapped before it get their own classes back and the error is raised."""
    done: list[tuple[nn.Module, type[nn.Module]]] = []
    try:
        for name, module in impls.conv_modules(model):
            impl = plan.get(name)
            if impl is None:
                continue
            done.append((module, type(module)))
            impls.swap(module, impl)
    except BaseException:
        for module, cls in reversed(done):
            module.__class__ = cls
        raise


def apply_settings(
    settings: Settings,
    model: nn.Module,
    device: str | torch.device | None = None,
    *,
    training: bool = True,
    warn: bool = True,
) -> Tuned:
    """Apply `settings` to `model` (in place) and to PyTorch's global flags; with `compile`,
    the returned `Tuned.model` is the model compiled last, after flags, layout and swaps."""
    dev = resolve_device(device)
    # Decide every layer before anything changes: a config that cannot be applied as written is
    # applied as far as it can be (with warnings), never half-way.
    used = plan_layers(model, settings, dev, warn=warn)
    if dev.type == "cpu":
        keep_cpu_buffers_resident()  # the malloc state every candidate was measured in
    model.to(placement(dev))
    fmt_ndim = _model_ndim(model)
    fmt = memory_format_for(fmt_ndim, settings.memory_format) if fmt_ndim else None
    if fmt is not None:
        _to_memory_format(model, fmt, fmt_ndim)
    swap_planned(model, used)
    flags = GlobalFlags()
    flags.apply(settings, dev)
    scaler = None
    if training and settings.amp == "fp16" and not _all_fp16(model):
        # A GradScaler keeps fp16 gradients of fp32 weights finite; it cannot unscale the
        # gradients of weights that are fp16 themselves.
        scaler = torch.amp.GradScaler(autocast_type(dev))
    return Tuned(compile_model(model, settings), settings, dev, flags, used, scaler, model)


def _all_fp16(model: nn.Module) -> bool:
    floating = [p for p in model.parameters() if p.is_floating_point()]
    return bool(floating) and all(p.dtype == torch.float16 for p in floating)


def _to_memory_format(model: nn.Module, fmt: torch.memory_format, ndim: int) -> None:
    """model.to(memory_format=fmt), which PyTorch refuses for a model holding a Lazy conv not
    called yet: then each tensor but that conv's weight (it has no shape yet) is converted."""
    tensors = [*model.parameters(), *model.buffers()]
    if not any(is_lazy(t) for t in tensors):
        model.to(memory_format=fmt)  # type: ignore[call-overload]  # real overload, not in stubs
        return
    with torch.no_grad():
        for t in tensors:
            if not is_lazy(t) and t.dim() == ndim:
                t.data = t.data.contiguous(memory_format=fmt)


def _model_ndim(model: nn.Module) -> int:
    """Tensor rank that the model's convs take (4 for Conv2d, 5 for Conv3d), 0 if none."""
    # From the kernel's dims, not the weight's: a Lazy conv's weight has none before its first
    # call, and a parametrized one would be computed to be asked.
    ranks = {len(getattr(m, "kernel_size", ())) + 2 for _, m in impls.conv_modules(model)}
    if 5 in ranks:
        return 5
    return 4 if 4 in ranks else 0


def apply(
    config: str | Path | Config,
    model: nn.Module | None = None,
    *,
    device: str | torch.device | None = None,
    training: bool | None = None,
) -> Tuned:
    """Apply a tuned config at training start: `tuned = advisor.apply("tuned.json", model)`.

    Sets the global flags, converts the model's memory format, swaps conv layers, compiles it
    when the config says so, and returns a `Tuned` with `.model` (compiled or not), `.module`
    (the model itself), `.autocast()` and `.scaler`. Warns (does not fail) when the config was
    tuned on another machine or library versions.
    """
    cfg = config if isinstance(config, Config) else load_config(config)
    if device is None and cfg.environment.device_type == "cuda" and not cuda_ops().is_available():
        warnings.warn(
            "config was tuned on CUDA, which is not available here: applying on CPU",
            AdvisorWarning,
            stacklevel=2,
        )
        device = "cpu"
    dev = resolve_device(device if device is not None else cfg.environment.device_type)
    here = current_environment(dev)
    diffs = here.mismatches(cfg.environment)  # the fields, not only the stored fingerprint
    if diffs:
        warnings.warn(
            f"config was tuned in another environment ({'; '.join(diffs)}): "
            "re-tune for best results",
            AdvisorWarning,
            stacklevel=2,
        )
    if cfg.settings.amp == "fp16" and dev.type == "cpu" and cfg.environment.device_type == "cuda":
        warnings.warn(
            "config turns on fp16 autocast, chosen on CUDA; on a CPU fp16 autocast is slow "
            "(often slower than fp32): re-tune on this CPU (bf16 is its half precision)",
            AdvisorWarning,
            stacklevel=2,
        )
    if training is None:
        training = cfg.mode == "train"
    if model is None:
        model = nn.Identity()
    return apply_settings(cfg.settings, model, dev, training=training)
