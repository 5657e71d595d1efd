"""A Lightning Callback that applies a tuned config: `Trainer(callbacks=[AdvisorCallback(path)])`.

- `setup()` (before Lightning moves the model and calls `configure_optimizers`) converts the
  layout, swaps conv layers and sets TF32 / cudnn.benchmark through `advisor.apply`. Swapped
  layers keep their parameters and state_dict keys, so checkpoints load into the untuned model.
- AMP is Lightning's: the config's amp becomes the Trainer's precision ("bf16-mixed",
  "16-mixed" with its GradScaler), installed as Lightning's own MixedPrecision plugin where the
  Trainer has its default "32-true" (Lightning keeps no record of whether "32-true" was passed,
  so it counts as the default). Any other precision was chosen by the user and is kept, with one
  warning naming both; so is "32-true" on a CPU for a config that chose fp16 (Lightning runs no
  fp16 AMP on a CPU), and under a strategy with a precision plugin of its own (FSDP, DeepSpeed).
- cudnn.benchmark and TF32 follow `precedence`: a config at the default leaves
  `Trainer(benchmark=True)` as it is; `Trainer(deterministic=True)` wins over a config that turns
  benchmark on, with one warning naming both. `Trainer(benchmark=False)` leaves no trace apart
  from the flag's default value, so a config that chose benchmark overrides it.
- Inputs: with channels_last, each batch's 4-D/5-D tensors are converted in place at the
  `on_{train,validation,test,predict}_batch_start` hooks, after Lightning moved them to the
  device (a callback cannot hand back a new batch).
- `teardown()` puts PyTorch's global flags back as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision
except ImportError:
    raise ImportError(
        "advisor.integrations.lightning needs Lightning: pip install 'conv-advisor[lightning]'"
    ) from None

from advisor.apply import Tuned
from advisor.config import Config
from advisor.integrations.layout import to_channels_last_in_place
from advisor.integrations.precedence import (
    UserValue,
    WarnOnce,
    apply_over_user,
    as_config,
    config_wins,
)

PRECISION_OF_AMP = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
AMP_OF_PRECISION = {v: k for k, v in PRECISION_OF_AMP.items()}


class AdvisorCallback(pl.Callback):
    """Applies a tuned config (a path or a `Config`) to the LightningModule at `setup()`.

    `tuned` is the `advisor.Tuned` in force between `setup()` and `teardown()`."""

    def __init__(self, config: str | Path | Config) -> None:
        self.config = as_config(config)  # a bad file fails here, before the Trainer starts
        self.tuned: Tuned | None = None
        self._warn = WarnOnce()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        user: dict[str, UserValue] = {}
        if torch.are_deterministic_algorithms_enabled():  # benchmark would break determinism
            user["cudnn_benchmark"] = (
                False,
                "deterministic algorithms (Trainer(deterministic=True))",
            )
        self.tuned = apply_over_user(
            self.config,
            pl_module,
            device=trainer.strategy.root_device,
            amp=self._precision(trainer),
            user=user,
            warn=self._warn,
        )

    def _precision(self, trainer: pl.Trainer) -> str:
        """Install the config's AMP as the Trainer's precision where the rule says so; returns
        the autocast the Trainer will run ('off', 'bf16', 'fp16')."""
        current = str(trainer.precision)
        running = AMP_OF_PRECISION.get(current, "off")  # "16-true", "64-true": no autocast
        wanted = self.config.settings.amp
        user = None
        if current != "32-true":
            user = (AMP_OF_PRECISION.get(current, current), f"Trainer(precision={current!r})")
        if not config_wins("amp", wanted, user, self._warn) or running == wanted:
            return running
        device = trainer.strategy.root_device.type
        precision = PRECISION_OF_AMP[wanted]
        if wanted == "fp16" and device == "cpu":
            self._warn(
                "config sets amp='fp16', which Lightning does not run on a CPU: keeping "
                "precision '32-true' (re-tune on this CPU: bf16 is its half precision)"
            )
            return running
        if type(trainer.strategy.precision_plugin) is not Precision:
            self._warn(
                f"config sets amp={wanted!r}, but the strategy has its own precision plugin: "
                f"keeping {current!r}; pass Trainer(precision={precision!r})"
            )
            return running
        trainer.strategy.precision_plugin = MixedPrecision(precision, device)  # type: ignore[arg-type]
        return wanted

    def _batch_start(self, batch: Any) -> None:
        if self.tuned is not None and self.tuned.settings.memory_format == "channels_last":
            to_channels_last_in_place(batch)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._batch_start(batch)

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, *args: Any
    ) -> None:
        self._batch_start(batch)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._batch_start(batch)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._batch_start(batch)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.tuned is not None:
            self.tuned.restore()
            self.tuned = None
