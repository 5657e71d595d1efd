"""What wins when a config and the user both set something: the rule every integration follows.

A setting the config leaves at PyTorch's default changes nothing the user set (tri-state, as
`TrainingArguments(tf32=None)` leaves TF32 alone). A setting the config changes is applied where
the user left it at its default; where the user set it otherwise, the user's value is kept and
one AdvisorWarning names both: what the user wrote in their training script wins over a file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advisor import impls
from advisor.apply import AdvisorWarning, Tuned, apply
from advisor.config import Config, load_config
from advisor.device import flags
from advisor.knobs import GlobalFlags, Settings


def as_config(config: str | Path | Config) -> Config:
    """A config given as a path (read and validated now: a bad file fails at once) or a Config."""
    return config if isinstance(config, Config) else load_config(config)


class WarnOnce:
    """AdvisorWarnings, each text at most once per integration object (setup runs per stage)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self._seen:
            self._seen.add(message)
            warnings.warn(message, AdvisorWarning, stacklevel=3)


# What the user set explicitly for a Settings field: (value, where it was set, for the warning).
UserValue = tuple[Any, str]


def config_wins(field: str, wanted: Any, user: UserValue | None, warn: WarnOnce) -> bool:
    """Whether the config's `wanted` value for `field` is put in force over the user's (`user`
    is None where the user left PyTorch's default)."""
    if wanted == Settings.model_fields[field].default:
        return False  # the config leaves it at the default: whatever the user has stays
    if user is None or user[0] == wanted:
        return True
    value, where = user
    warn(f"config sets {field}={wanted!r}, but {where} sets {value!r}: keeping {value!r}")
    return False


def _tf32_now() -> str:
    """TF32 as it is in force now, in the config's terms (or 'matmul only', which it has none for)."""
    conv = GlobalFlags.read()["tf32"]["conv"] in (True, "tf32")
    matmul = GlobalFlags.matmul_tf32()
    if conv:
        return "on" if matmul else "conv"
    return "matmul only" if matmul else "off"


def user_flags() -> dict[str, UserValue]:
    """The global flags changed from PyTorch's defaults before training starts, by Settings
    field: a framework's own flag arguments (`Trainer(benchmark=True)`,
    `TrainingArguments(tf32=...)`) have been written to PyTorch by then."""
    now = {"tf32": _tf32_now(), "cudnn_benchmark": flags.cudnn_benchmark()}
    return {
        k: (v, "torch.backends (set before training)")
        for k, v in now.items()
        if v != Settings.model_fields[k].default
    }


def model_memory_format(model: nn.Module) -> str | None:
    """'channels_last' when the model's conv weights already have that layout, else None."""
    for _, module in impls.conv_modules(model):
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() in (4, 5) and not w.is_contiguous():
            fmt = torch.channels_last if w.dim() == 4 else torch.channels_last_3d
            if w.is_contiguous(memory_format=fmt):
                return "channels_last"
    return None


def apply_over_user(
    config: Config,
    model: nn.Module,
    *,
    device: str | torch.device | None,
    amp: str,
    user: dict[str, UserValue],
    warn: WarnOnce,
) -> Tuned:
    """`advisor.apply` under the rule above: layout, conv layers and global flags (no compile).

    `amp` is the autocast the framework will run (it owns autocast; the conv layers are planned
    for its dtype). `user` holds what the framework's arguments set, by Settings field; the global
    flags found now (`user_flags`) count as set by the user too, and so does a model already in
    channels_last."""
    settings = config.settings
    user = {**user_flags(), **user}
    # A model the user converted stays converted (a config at the default never turns it back).
    layout = model_memory_format(model) or settings.memory_format
    flag_fields = [k for k in GlobalFlags.read() if k in Settings.model_fields]
    kept = {k for k in flag_fields if not config_wins(k, getattr(settings, k), user.get(k), warn)}
    # Eager: the framework runs torch.compile (Lightning's callback in place, HF from its
    # TrainingArguments); the compiled wrapper `apply` returns would go unused.
    effective = settings.model_copy(update={"memory_format": layout, "amp": amp}).eager()
    before = GlobalFlags.read()
    tuned = apply(
        config.model_copy(update={"settings": effective}), model, device=device, training=False
    )
    # apply wrote every flag; put back those the config does not decide (restore() still returns
    # to `before` as a whole). TF32's exact state travels with it ("tf32_raw").
    kept |= {"tf32_raw"} if "tf32" in kept else set()
    GlobalFlags.write({k: before[k] if k in kept else v for k, v in GlobalFlags.read().items()})
    return tuned
