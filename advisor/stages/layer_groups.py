"""Conv layers grouped for the per-layer stage: one measurement per signature and input.

Layers with the same signature and the same input (shape, dtype, layout, whether it needs a
gradient) share one layer workload, with the first layer's weights; a layer the stage cannot
take is a group of its own, kept with the reason (`LayerGroup.kept`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from advisor import impls
from advisor.errors import first_line
from advisor.impls.classes import conv_input_shape, recipe_for
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate, ConvInput, Mode
from advisor.workload.build import Workload, layer_workload_from_module
from advisor.workload.info import LayerInfo
from advisor.workload.layer_spec import DTYPE_NAMES, LayerSpec

__all__ = ["LayerGroup", "conv_inputs", "layer_groups"]


@dataclass(frozen=True)
class LayerGroup:
    """Conv layers that share a signature and an input shape: one measurement serves them all.

    A layer the stage cannot take is a group of its own, unmeasured: `kept` says why. `recipe`:
    its class computes more than a conv, as a recipe says (impls.classes)."""

    key: str
    names: tuple[str, ...]
    description: str
    workload: Workload | None
    kept: str | None = None
    recipe: bool = False

    @property
    def spec(self) -> LayerSpec:
        assert self.workload is not None, "a kept layer has no spec"
        info = self.workload.info
        assert isinstance(info, LayerInfo)  # layer_groups makes layer workloads only
        return info.spec


def conv_inputs(
    workload: Workload, settings: Settings, device: torch.device, mode: Mode
) -> dict[str, ConvInput]:
    """What every conv layer receives in the model under `settings`, from one step: its input's
    shape, dtype (bf16 activations under autocast), layout, and (train) whether it needs a
    gradient (not for a layer that takes the network's input)."""
    # No optimizer: a capture does not step one, and building one imports Dynamo (over a second
    # in the main process, which compiles nothing).
    cand = Candidate(workload, settings, device, mode, optimizer=False)
    try:
        return {c.name: c for c in cand.capture(record_convs=True).convs}
    finally:
        cand.close()


def layer_groups(
    workload: Workload, settings: Settings, device: torch.device, mode: Mode = "infer"
) -> list[LayerGroup]:
    """Conv layers grouped by signature and by what they receive: one measurement per group.

    Each group's layer workload has its first layer's weights; for a model file it also names
    where that layer lives, so an isolated worker rebuilds it with the same weights."""
    seen = conv_inputs(workload, settings, device, mode)
    model = workload.make_model()
    groups: dict[str, list[str]] = {}
    shapes: dict[str, tuple[int, ...]] = {}  # what PyTorch's conv receives (a recipe may pad)
    out = []
    modules = dict(impls.conv_modules(model))
    for name, module in modules.items():
        if name not in seen:
            continue  # never called in the forward pass
        c = seen[name]
        try:
            kept = impls.class_reason(module)
            if kept is None:
                shapes[name] = conv_input_shape(module, c.shape)
                sig = impls.ConvSignature.from_module(module)
        except Exception as e:  # noqa: BLE001 - one layer the stage cannot take stops nothing
            kept = f"the per-layer stage cannot describe it: {first_line(e)}"
        if kept is not None:
            out.append(_kept(name, module, kept))
            continue
        recipe = "|recipe" if recipe_for(type(module)) is not None else ""
        key = f"{sig}|{shapes[name]}|{c.dtype}|{c.layout}|grad={c.requires_grad}{recipe}"
        groups.setdefault(key, []).append(name)
    for key, names in groups.items():
        c = seen[names[0]]
        try:
            wl = layer_workload_from_module(
                modules[names[0]],
                shapes[names[0]],
                input_dtype=DTYPE_NAMES[c.dtype],
                input_layout=c.layout if c.layout != "strided" else "contiguous",
                input_grad=c.requires_grad,
                source=workload.info.layer_source(names[0]),
            )
        except Exception as e:  # noqa: BLE001
            why = f"the per-layer stage cannot time it alone: {first_line(e)}"
            out += [_kept(n, modules[n], why) for n in names]
            continue
        out.append(LayerGroup(key, tuple(names), wl.name, wl, recipe=key.endswith("|recipe")))
    return out


def _kept(name: str, module: nn.Module, why: str) -> LayerGroup:
    desc = f"{type(module).__name__}({module.extra_repr()})"
    return LayerGroup(f"kept|{name}", (name,), desc, None, kept=why)
