"""Measured auto-tuning of PyTorch convolution settings.

advice = advisor.advise(model, (x,), mode="train")     # search (imports optuna lazily)
advice.save("tuned.json")
tuned = advisor.apply("tuned.json", model)             # at training start: no optuna, no pandas
with tuned.autocast():
    loss = tuned.model(x).sum()
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from advisor.execute.profiling import start_early

start_early()  # $ADVISOR_PROFILE_DIR: the command's profile begins before torch's import

# The import makes torch's many objects and no garbage: no collection walks them meanwhile, and
# they join the oldest generation unwalked (freeze, unfreeze), not through two young collections.
_collecting = gc.isenabled()
gc.disable()
try:
    from advisor.apply import AdvisorWarning, Tuned, apply, apply_settings
    from advisor.config import Config, config_schema, load_config, save_config
    from advisor.device.environment import Environment, current_environment
    from advisor.errors import AdvisorError
    from advisor.knobs import Settings
    from advisor.version import __version__
    from advisor.workload.layer_spec import LayerSpec, layer_spec
finally:
    gc.freeze()
    gc.unfreeze()
    if _collecting:
        gc.enable()

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

    from advisor.advice import Advice
    from advisor.search.options import Progress


def advise(
    model: nn.Module | None = None,
    inputs: Any = None,
    *,
    layer: str | dict[str, Any] | None = None,
    input_shape: str | list[int] | tuple[int, ...] | None = None,
    dtype: str | None = None,
    first_layer: bool = False,
    model_file: str | None = None,
    input_shapes: list[Any] | None = None,
    batch_sizes: list[int] | None = None,
    shape_weights: list[float] | None = None,
    mode: str = "infer",
    device: str = "auto",
    space: str | None = None,
    trials: int | None = None,
    storage: str | None = "memory",
    study_name: str | None = None,
    fresh: bool = False,
    isolate: bool = False,
    trial_timeout_s: float = 600.0,
    max_memory_mb: float | None = None,
    objectives: tuple[str, ...] = ("time",),
    tolerances: dict[str, float] | None = None,
    budget_s: float | None = None,
    accept_noisy: bool = False,
    steps: int | None = None,
    effort: str = "default",
    progress: Callable[[Progress], None] | None = None,
) -> Advice:
    """Search the settings for a model (with example inputs), a layer spec, or a model file.

    `input_shapes` (several shapes) or `batch_sizes`, with optional `shape_weights`, tune for a
    shape set: the weighted time over those shapes. In train mode a layer's input needs a gradient
    (it is an activation inside a network) unless `first_layer=True`. `tolerances` overrides the
    space's numeric-gate settings, e.g. `{"grad_tolerances.fp32": 2e-3}`. `budget_s` bounds the
    whole run (default: the space's budget.time_s): the best answer so far, and what was not
    measured. When PyTorch's default itself moved by more than 2x under the measurements (across
    the re-time's rounds, or between its trial and the re-time on a busy machine), the default
    is kept unless `accept_noisy=True`. `steps`: the training steps expected; a torch.compile
    candidate is recommended only if its compile pays within them. A change is recommended only
    if it holds in a final check against the default where the user runs it (a fresh process
    with `isolate=True` for a model file or layer spec). Returns an `Advice`: `.settings`,
    `.config`, `.trials` (a DataFrame), `.save(path)`. `storage` is 'memory' (default for the
    API), None for the embedded default study file, or a database URL / journal path; a stored
    study resumes where it stopped (`fresh=True` discards it first)."""
    arguments = dict(locals())  # every parameter, as given: run_advise takes them all
    from advisor.service import run_advise  # the search engine: optuna loads here
    from advisor.workload.preflight import check_workload_sizes

    # Absurd sizes are a one-line SpecError here, before anything is allocated.
    check_workload_sizes(
        device,
        layer=layer,
        input_shape=input_shape,
        input_shapes=input_shapes,
        batch_sizes=batch_sizes,
        dtype=dtype,
        first_layer=first_layer,
    )
    return run_advise(**arguments)


__all__ = [
    "AdvisorError",
    "AdvisorWarning",
    "Config",
    "Environment",
    "LayerSpec",
    "Settings",
    "Tuned",
    "__version__",
    "advise",
    "apply",
    "apply_settings",
    "config_schema",
    "current_environment",
    "layer_spec",
    "load_config",
    "save_config",
]
