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
- torch.compile: where the config chose it, `setup()` compiles last (after the layout and
  swaps, as `advisor.apply`), in place, with the config's mode and `dynamic`: the outermost
  submodules with a forward of their own that hold the conv layers (`networks`), so `self(x)`
  and `self.net(x)` both run compiled; the LightningModule itself where its conv layers hang on
  it directly. The module objects, parameters and state_dict keys stay (no `_orig_mod.`
  prefix); they stay compiled after `teardown()`, as the swaps stay. A compile of the user's
  (`trainer.fit(torch.compile(model))`, `.compile()`, a `torch.compile`d submodule) is kept,
  with one warning; so is an eager model under a strategy Lightning does not compile under (its
  own list: single device, DDP, FSDP).
- Inputs: with channels_last, each batch's 4-D/5-D tensors are converted in place at the
  `on_{train,validation,test,predict}_batch_start` hooks, after Lightning moved them to the
  device (a callback cannot hand back a new batch).
- `teardown()` puts PyTorch's global flags back as they were.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._dynamo import OptimizedModule

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        FSDPStrategy,
        SingleDeviceStrategy,
    )
except ImportError:
    raise ImportError(
        "advisor.integrations.lightning needs Lightning: pip install 'conv-advisor[lightning]'"
    ) from None

from advisor import impls
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
from advisor.knobs import Settings

PRECISION_OF_AMP = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
AMP_OF_PRECISION = {v: k for k, v in PRECISION_OF_AMP.items()}
# The strategies Lightning runs a compiled model under (`_verify_strategy_supports_compile`).
COMPILE_STRATEGIES = (SingleDeviceStrategy, DDPStrategy, FSDPStrategy)
_COMPILED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # what compile_in_place compiled


def networks(module: pl.LightningModule) -> list[str] | None:
    """The submodules to compile for `module`'s conv layers: for each layer, its outermost
    ancestor below `module` with a forward of its own (an `nn.ModuleList` has none). None where a
    layer hangs on `module` directly (through containers only) or there is no conv layer: then
    `module` itself is the network."""
    found: dict[str, None] = {}
    for name, _ in impls.conv_modules(module):
        parts = name.split(".")
        for i in range(1, len(parts)):
            path = ".".join(parts[:i])
            if type(module.get_submodule(path)).forward is not nn.Module.forward:
                found[path] = None
                break
        else:
            return None
    return list(found) or None


def user_compiled(module: pl.LightningModule) -> str | None:
    """Where the user's code compiled `module` or a submodule of it (None: nowhere)."""
    if getattr(module, "_compiler_ctx", None) is not None:
        return "trainer.fit(torch.compile(model))"
    for name, sub in module.named_modules():
        if sub in _COMPILED:
            continue
        if isinstance(sub, OptimizedModule):
            return f"torch.compile of {name!r}"
        if getattr(sub, "_compiled_call_impl", None) is not None:
            return f"{name or 'model'}.compile()"
    return None


def compile_in_place(module: nn.Module, settings: Settings) -> None:
    """`module` compiled as `advisor.compiled.compile_model` compiles it (its call, hooks
    included, with the settings' mode and dynamic), in place: calling it runs the compiled code,
    while the module object, its parameters and state_dict keys stay. What `nn.Module.compile`
    does, but from a frame of ours: it compiles `Module._call_impl`, a torch.nn frame that Dynamo
    skips, and so compiles nothing for a module whose forward is torch.nn's own (nn.Sequential).
    A copy or an unpickled module comes back eager (torch drops `_compiled_call_impl`)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)

    module._compiled_call_impl = torch.compile(
        call, mode=settings.compile, dynamic=settings.compile_dynamic
    )
    _COMPILED.add(module)


def _compile_call(settings: Settings) -> str:
    dynamic = "" if settings.compile_dynamic is None else f", dynamic={settings.compile_dynamic}"
    return f"torch.compile(model, mode={settings.compile!r}{dynamic})"


class AdvisorCallback(pl.Callback):
    """Applies a tuned config (a path or a `Config`) to the LightningModule at `setup()`.

    `tuned` is the `advisor.Tuned` in force between `setup()` and `teardown()` (its `model` is
    the LightningModule); `compiled` names the submodules compiled in place ("" for the
    LightningModule itself)."""

    def __init__(self, config: str | Path | Config) -> None:
        self.config = as_config(config)  # a bad file fails here, before the Trainer starts
        self.tuned: Tuned | None = None
        self.compiled: list[str] = []
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
        if self._compile(trainer, pl_module):
            settings = self.config.settings
            self.tuned.settings = self.tuned.settings.model_copy(
                update={"compile": settings.compile, "compile_dynamic": settings.compile_dynamic}
            )

    def _compile(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """Compile the module's networks in place where the config and the rule say so, last
        (after the layout and swaps, as `advisor.apply`); whether the config's compile runs."""
        settings = self.config.settings
        if not settings.compiled:
            return False  # the default: whatever the user compiled stays as it is
        where = user_compiled(pl_module)
        if where is not None:
            self._warn(
                f"config sets compile={settings.compile!r}, but {where} compiled the model "
                "already: keeping that compile"
            )
            return False
        strategy = trainer.strategy
        if not isinstance(strategy, COMPILE_STRATEGIES) or isinstance(strategy, DeepSpeedStrategy):
            self._warn(
                f"config sets compile={settings.compile!r}, which Lightning does not run under "
                f"{type(strategy).__name__}: not compiled"
            )
            return False
        names = networks(pl_module)
        if names is None:
            if type(pl_module).forward is pl.LightningModule.forward:
                self._warn(
                    f"config sets compile={settings.compile!r}, but the LightningModule holds "
                    "its conv layers itself and has no forward to compile: pass "
                    f"trainer.fit({_compile_call(settings)})"
                )
                return False
            names = [""]  # its forward is the network: runs compiled where the steps call self(x)
        for name in names:
            module = pl_module.get_submodule(name)
            if module not in _COMPILED:  # compiled at an earlier stage's setup: compiled still
                compile_in_place(module, settings)
        self.compiled = names
        return True

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
