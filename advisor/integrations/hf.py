"""The Hugging Face Trainer: the `TrainingArguments` a config implies, and the rest.

    cfg = "tuned.json"
    args = TrainingArguments("out", **training_args_kwargs(cfg), ...)
    trainer = Trainer(model=model, args=args, callbacks=[AdvisorCallback(cfg)], ...)

- `training_args_kwargs(config)`: only the fields the config changes from PyTorch's default
  (tri-state: `tf32` stays absent, i.e. None, for the default TF32): amp bf16 -> `bf16=True`
  (with `use_cpu=True` for a config tuned on a CPU: HF refuses CPU bf16 without it), fp16 ->
  `fp16=True` (on a GPU only: HF trains in fp32 with `fp16=True` on a CPU, so it is left out,
  with a warning), tf32 off/on -> `tf32=False/True`, compile -> `torch_compile=True,
  torch_compile_mode=<mode>` (HF compiles the whole model at train start, after the callback's
  changes: last, as `advisor.apply` does; a `compile_dynamic` it cannot pass is warned about).
- `prepare(model, config)`: what `TrainingArguments` cannot express: the layout, the conv layers
  and cudnn.benchmark, by `precedence`'s rule (not compile: the Trainer compiles). With
  channels_last, a forward pre-hook gives the model's tensor inputs that layout: the Trainer
  calls `model(**inputs)` itself, and a TrainerCallback never sees the batch.
- `AdvisorCallback(config)`: `prepare` when the Trainer is made (before it makes the optimizer),
  then one warning naming both wherever the `TrainingArguments` differ from the config (they
  win: HF sets up autocast, TF32 and torch.compile from them); PyTorch's flags are put back when
  training ends.
"""

from __future__ import annotations

import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

try:
    from transformers import TrainerCallback, TrainingArguments
except ImportError:
    raise ImportError(
        "advisor.integrations.hf needs transformers: pip install 'conv-advisor[hf]'"
    ) from None

from advisor.apply import AdvisorWarning, Tuned
from advisor.config import Config
from advisor.integrations.layout import ChannelsLastInputs
from advisor.integrations.precedence import (
    UserValue,
    WarnOnce,
    apply_over_user,
    as_config,
    config_wins,
)

_HOOKED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models given the input-layout hook
_FP16_ON_CPU = (
    "config sets amp='fp16', which the HF Trainer does not run on a CPU (fp16=True with use_cpu "
    "trains in fp32): re-tune on this CPU (bf16 is its half precision)"
)
_DYNAMIC = (
    "config sets compile_dynamic={}, which TrainingArguments cannot pass: HF compiles with "
    "dynamic=None (static shapes, dynamic once a shape changes)"
)


def training_args_kwargs(config: str | Path | Config) -> dict[str, Any]:
    """The `TrainingArguments` fields the config implies; empty for PyTorch's defaults."""
    cfg = as_config(config)
    settings, on_cpu = cfg.settings, cfg.environment.device_type == "cpu"
    kwargs: dict[str, Any] = {}
    if settings.amp == "bf16":
        kwargs.update(bf16=True, **({"use_cpu": True} if on_cpu else {}))
    elif settings.amp == "fp16":
        if on_cpu:
            warnings.warn(_FP16_ON_CPU, AdvisorWarning, stacklevel=2)
        else:
            kwargs["fp16"] = True
    if settings.tf32 != "conv":  # HF's tf32 is all-or-nothing: "off" or "on" in the config's terms
        kwargs["tf32"] = settings.tf32 == "on"
    if settings.compiled:
        kwargs.update(torch_compile=True, torch_compile_mode=settings.compile)
        if settings.compile_dynamic is not None:
            warnings.warn(_DYNAMIC.format(settings.compile_dynamic), AdvisorWarning, stacklevel=2)
    return kwargs


def prepare(
    model: nn.Module, config: str | Path | Config, *, device: str | torch.device | None = None
) -> nn.Module:
    """Apply what `TrainingArguments` cannot express to `model` (in place, also returned).

    The conv layers are planned for the config's autocast, which `training_args_kwargs` asks
    the Trainer for; `device` defaults to the config's device type (as `advisor.apply`)."""
    cfg = as_config(config)
    _prepare(model, cfg, device=device, amp=cfg.settings.amp, user={}, warn=WarnOnce())
    return model


def _prepare(
    model: nn.Module,
    cfg: Config,
    *,
    device: str | torch.device | None,
    amp: str,
    user: dict[str, UserValue],
    warn: WarnOnce,
) -> Tuned:
    tuned = apply_over_user(cfg, model, device=device, amp=amp, user=user, warn=warn)
    if tuned.settings.memory_format == "channels_last" and model not in _HOOKED:
        model.register_forward_pre_hook(ChannelsLastInputs(), with_kwargs=True)
        # The Trainer saves checkpoints with safetensors, which refuses a channels_last weight
        # (not contiguous in its sense): its state_dict gets contiguous copies, which load
        # into the untuned model alike.
        model.register_state_dict_post_hook(_contiguous_state)
        _HOOKED.add(model)
    return tuned


def _contiguous_state(module: nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
    for key, value in state.items():
        if torch.is_tensor(value) and not value.is_contiguous():
            state[key] = value.contiguous()


class AdvisorCallback(TrainerCallback):
    """Applies a tuned config (a path or a `Config`) to the Trainer's model; see the module."""

    def __init__(self, config: str | Path | Config) -> None:
        self.config = as_config(config)  # a bad file fails here, before the Trainer starts
        self.tuned: Tuned | None = None
        self._warn = WarnOnce()

    def _apply(self, args: TrainingArguments, model: nn.Module | None) -> None:
        if self.tuned is not None or model is None:
            return
        wanted = self.config.settings.amp
        running = "bf16" if args.bf16 else "fp16" if args.fp16 else "off"
        if running == "fp16" and args.device.type == "cpu":
            running = "off"  # HF runs no fp16 autocast on a CPU
        flags = f"TrainingArguments(bf16={args.bf16}, fp16={args.fp16})"
        user_amp = None if running == "off" else (running, flags)
        # The config's amp wins only over no autocast, which HF cannot change after it is made.
        if config_wins("amp", wanted, user_amp, self._warn) and running != wanted:
            self._warn(
                _FP16_ON_CPU
                if wanted == "fp16" and args.device.type == "cpu"
                else f"config sets amp={wanted!r}, which {flags} does not run: "
                "pass **training_args_kwargs(config) to TrainingArguments"
            )
        self._check_compile(args)
        user: dict[str, UserValue] = {}
        if args.tf32 is not None:
            user["tf32"] = ("on" if args.tf32 else "off", f"TrainingArguments(tf32={args.tf32})")
        self.tuned = _prepare(
            model, self.config, device=args.device, amp=running, user=user, warn=self._warn
        )

    def _check_compile(self, args: TrainingArguments) -> None:
        """The config's compile against the TrainingArguments', by the amp rule: HF compiles
        from its arguments alone, so a difference is only said."""
        wanted, running = self.config.settings.compile, "off"
        flags = f"TrainingArguments(torch_compile={args.torch_compile}"
        if args.torch_compile:
            running = args.torch_compile_mode or "default"
            flags += f", torch_compile_mode={args.torch_compile_mode!r}"
            if args.torch_compile_backend not in (None, "inductor"):  # not what was timed
                running += f" on backend {args.torch_compile_backend!r}"
                flags += f", torch_compile_backend={args.torch_compile_backend!r}"
        flags += ")"
        user = None if running == "off" else (running, flags)
        if config_wins("compile", wanted, user, self._warn) and running != wanted:
            self._warn(
                f"config sets compile={wanted!r}, which {flags} does not run: "
                "pass **training_args_kwargs(config) to TrainingArguments"
            )

    def on_init_end(self, args: TrainingArguments, state: Any, control: Any, **kw: Any) -> None:
        self._apply(args, kw.get("model"))

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any, **kw: Any) -> None:
        self._apply(args, kw.get("model"))  # added after the Trainer was made, or trained again

    def on_train_end(self, args: TrainingArguments, state: Any, control: Any, **kw: Any) -> None:
        if self.tuned is not None:
            self.tuned.restore()
            self.tuned = None
