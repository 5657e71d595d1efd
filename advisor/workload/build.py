"""Workloads: what the advisor times. A model factory, example inputs and a typed description.

Made from a layer spec (`layer_workload`), a conv layer of a model (`layer_workload_from_module`),
a model file (`model_workload`) or a live model (`object_workload`); `advisor.workload.shape_sets`
spreads one over several input shapes or batch sizes. Its `info` (advisor.workload.info) is what
goes into the config file and the study, and what an isolated worker rebuilds it from
(`advisor.workload.rebuild`).

Inputs are positional (`example_inputs`) and keyword (`example_kwargs`): the model is called as
`model(*args, **kwargs)` (see advisor.workload.model_file for the convention a model file follows).

Specs are parsed in advisor.workload.layer_spec and model files loaded in
advisor.workload.model_file.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from advisor.device.ops import placement
from advisor.errors import ModelFileError, SpecError, first_line
from advisor.workload.copying import copy_module, copying_factory
from advisor.workload.info import (
    LayerInfo,
    LayerSource,
    ModelFileInfo,
    ObjectInfo,
    WorkloadInfo,
)
from advisor.workload.layer_spec import DTYPES, LayerSpec, spec_from_module
from advisor.workload.model_file import (
    build_model,
    call_tensors,
    check_runs,
    fresh_like,
    load_model,
    split_inputs,
)

__all__ = [
    "ShapeCase",
    "Workload",
    "layer_workload",
    "layer_workload_from_module",
    "model_workload",
    "object_workload",
]


@dataclass(frozen=True)
class ShapeCase:
    """One input shape of a shape set, with its weight (how often it occurs in training)."""

    weight: float
    inputs: tuple[Any, ...]  # positional
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # keyword

    @property
    def tensors(self) -> list[torch.Tensor]:
        return call_tensors(self.inputs, self.kwargs)


@dataclass
class Workload:
    """Something the advisor can time: a model factory and example inputs, plus a description.

    `make_model()` returns a fresh model (fp32 weights, same values every call);
    `make_call(device)` returns fresh random inputs shaped like the examples, positional and
    keyword: the model runs as `model(*args, **kwargs)`.
    """

    name: str
    info: WorkloadInfo  # what goes into the config file and the study, and to workers
    make_model: Callable[[], nn.Module]
    example_inputs: tuple[Any, ...]
    cases: tuple[ShapeCase, ...] = ()  # a shape set; empty: just the example inputs
    # Which inputs need a gradient in train mode (a layer inside a network: its input is an
    # activation; a network's own inputs are data). Empty: none.
    input_grad: tuple[bool, ...] = ()
    input_layout: str | None = None  # the layout inputs arrive in; None: the candidate's format
    example_kwargs: Mapping[str, Any] = field(default_factory=dict)  # keyword inputs

    @property
    def is_layer(self) -> bool:
        return isinstance(self.info, LayerInfo)

    @functools.cached_property
    def param_dtype(self) -> torch.dtype:
        """The dtype of the model's floating parameters (a layer spec may be fp16)."""
        for p in self.make_model().parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    @functools.cached_property
    def warmed(self) -> set[tuple[int, str]]:
        """(shape case, memory format) of each step this process has warmed up until it settled
        (`advisor.measure.settle`): one-time costs a later step in that layout does not pay."""
        return set()

    @property
    def shape_cases(self) -> tuple[ShapeCase, ...]:
        return self.cases or (ShapeCase(1.0, self.example_inputs, self.example_kwargs),)

    @property
    def shape_weights(self) -> tuple[float, ...]:
        """Each shape case's weight: what a process that only combines measurements needs."""
        return tuple(c.weight for c in self.shape_cases)

    def make_call(
        self, device: torch.device, seed: int = 0, case: int = 0
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Fresh inputs for `model(*args, **kwargs)`: floating tensors redrawn from `seed`,
        integer and bool tensors kept, on `device`; other values as they are."""
        gen = torch.Generator().manual_seed(seed)
        example = self.shape_cases[case]

        def fresh(x: Any) -> Any:
            return fresh_like(x, gen).to(placement(device)) if torch.is_tensor(x) else x

        args = tuple(fresh(x) for x in example.inputs)  # positional first: the draw order
        return args, {k: fresh(v) for k, v in example.kwargs.items()}

    @property
    def input_shapes(self) -> list[list[int]]:
        return [list(x.shape) for x in call_tensors(self.example_inputs, self.example_kwargs)]


# ----- layers -----


def layer_workload(spec: LayerSpec) -> Workload:
    """A layer spec of its own: freshly initialised weights."""
    return _layer_workload(spec, spec.build().state_dict())


def layer_workload_from_module(
    module: nn.Module,
    input_shape: Sequence[int],
    *,
    input_dtype: str | None = None,
    input_layout: str | None = None,
    input_grad: bool = True,
    source: LayerSource | None = None,
) -> Workload:
    """A layer workload that uses `module`'s own weights (so its numbers match the model's), fed
    the input it receives in the model: dtype, layout, and whether it needs a gradient.

    With `source` (where the module lives in a model file) an isolated worker rebuilds the layer
    with those weights too; without it a worker can only build the spec with fresh weights."""
    spec = spec_from_module(module, input_shape).model_copy(
        update={
            "input_dtype": input_dtype,
            "input_layout": input_layout,
            "first_layer": not input_grad,
        }
    )
    return _layer_workload(LayerSpec.model_validate(spec.model_dump()), conv_state(module), source)


def conv_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The weight and bias PyTorch's conv receives from `module` now, under nn.ConvNd's own
    keys: a weight-normed or spectral-normed weight as computed (its state_dict holds the
    parametrization's originals, or weight_g/weight_v, instead), for a plain conv to load."""
    m: Any = module
    with torch.no_grad():
        state = {"weight": m.weight.detach()}
        if m.bias is not None:
            state["bias"] = m.bias.detach()
    return state


def _layer_workload(
    spec: LayerSpec, state_dict: Mapping[str, torch.Tensor], source: LayerSource | None = None
) -> Workload:
    state = {k: v.detach().cpu().float().clone() for k, v in state_dict.items()}

    def make_model() -> nn.Module:
        m = spec.construct()
        m.load_state_dict(state)
        return m.to(DTYPES[spec.dtype])

    example = (torch.empty(spec.input_shape, dtype=DTYPES[spec.input_dtype or spec.dtype]),)
    info = LayerInfo(spec=spec, description=spec.describe(), source=source)
    return Workload(
        info.description,
        info,
        make_model,
        example,
        input_grad=(not spec.first_layer,),
        input_layout=spec.input_layout,
    )


def layer_from_source(spec: LayerSpec, source: LayerSource) -> Workload:
    """The layer `source.module` of a model file, with the model's weights (isolated workers)."""
    model = build_model(source.target, build=source.build)
    where = f"layer {source.module!r} of {source.target}"
    try:
        module = model.get_submodule(source.module)
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            # A Lazy conv takes its sizes and weights at its first call, which the file's
            # factory does not make: the layer as its spec says, with fresh weights.
            return _layer_workload(spec, spec.build().state_dict(), source)
        found = spec_from_module(module, spec.input_shape, spec.dtype)
    except (AttributeError, ValueError, SpecError) as e:  # gone, or no longer a conv layer
        raise ModelFileError(f"{where}: {first_line(e, with_type=False)}") from None
    if not found.same_layer(spec):  # the file changed since the layer was described
        raise ModelFileError(f"{where} is now {found.describe()}, not {spec.describe()}")
    return _layer_workload(spec, conv_state(module), source)


# ----- models -----


def model_workload(
    target: str | Path,
    *,
    build: str = "build_model",
    inputs: str = "example_inputs",
) -> Workload:
    """A model from a Python file (`path.py`) or a module (`package.module[:build]`)."""
    loaded = load_model(target, build=build, inputs=inputs)
    state = {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}
    build_fn = loaded.build_fn  # not `loaded`: the closure must not keep the first model alive

    def fresh_model() -> nn.Module:
        m: nn.Module = build_fn()
        m.load_state_dict(state)
        return m

    def share(kept: nn.Module) -> None:
        # The model copied from is never changed: its tensors can stand for `state`, so a
        # process holds the weights once, not twice.
        state.update(kept.state_dict())

    make_model = copying_factory(fresh_model, share)
    info = ModelFileInfo(
        target=loaded.target,
        build=loaded.build,
        inputs=loaded.inputs,
        input_shapes=loaded.input_shapes,
        description=loaded.description,
    )
    return Workload(
        info.description, info, make_model, loaded.example, example_kwargs=loaded.kwargs
    )


def object_workload(model: nn.Module, inputs: Any) -> Workload:
    """A workload from a live model and example inputs (the Python API): a tensor, a tuple or
    list of positional inputs, or a dict of keyword inputs (see advisor.workload.model_file)."""
    if not isinstance(model, nn.Module):
        raise ModelFileError(f"model must be an nn.Module, got {type(model).__name__}")
    args, kwargs = split_inputs(inputs, "the example inputs")

    def cpu(x: Any) -> Any:
        return x.cpu() if torch.is_tensor(x) else x

    example = tuple(cpu(x) for x in args)
    example_kwargs = {k: cpu(v) for k, v in kwargs.items()}
    base = copy_module(model).cpu().float()

    def make_model() -> nn.Module:
        return copy_module(base)

    shapes = [list(x.shape) for x in call_tensors(example, example_kwargs)]
    try:
        check_runs(copy_module(base), example, example_kwargs)
    except Exception as e:  # noqa: BLE001
        raise ModelFileError(
            f"model fails on the example inputs {shapes}: {first_line(e)}"
        ) from None
    info = ObjectInfo(
        target=f"<{type(model).__name__} object>",
        architecture=hashlib.sha256(repr(model).encode()).hexdigest()[:12],
        input_shapes=shapes,
        description=f"{type(model).__name__} on {shapes}",
    )
    return Workload(info.description, info, make_model, example, example_kwargs=example_kwargs)
