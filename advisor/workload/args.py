"""The user's workload arguments (a live model, a layer spec, a model file; a shape set) ->
a `Workload`. Shared by the advise pipeline, `advisor worker` and the first isolated run of the
user's code (`advisor.execute.probe`), so all three build exactly the same workload."""

from __future__ import annotations

from typing import Any

from torch import nn

from advisor.errors import AdvisorError
from advisor.workload.build import (
    Workload,
    layer_workload,
    model_workload,
    object_workload,
)
from advisor.workload.layer_spec import layer_spec
from advisor.workload.shape_sets import with_shape_set
from advisor.workload.sizes import shape_of

__all__ = ["make_workload"]


def make_workload(
    *,
    model: nn.Module | None = None,
    inputs: Any = None,
    layer: str | dict[str, Any] | None = None,
    layer_file: str | None = None,
    input_shape: Any = None,
    dtype: str | None = None,
    first_layer: bool = False,
    model_file: str | None = None,
    build: str = "build_model",
    inputs_fn: str = "example_inputs",
    input_shapes: list[Any] | None = None,
    batch_sizes: list[int] | None = None,
    shape_weights: list[float] | None = None,
) -> Workload:
    """The workload to tune. Several input shapes or batch sizes (with weights) make a shape set:
    the objective is then the weighted time over those shapes."""
    given = [x is not None for x in (model, layer or layer_file, model_file)]
    if sum(given) != 1:
        raise AdvisorError("give exactly one of: a model with inputs, a layer spec, a model file")
    if first_layer and not (layer or layer_file):
        raise AdvisorError("--first-layer describes a layer spec, not a model")
    workload: Workload
    if model is not None:
        if inputs is None:
            raise AdvisorError("a model needs example inputs: advise(model, (x,))")
        workload = object_workload(model, inputs)
    elif model_file is not None:
        workload = model_workload(model_file, build=build, inputs=inputs_fn)
    else:
        shape = input_shape or (input_shapes[0] if input_shapes else None)
        spec = layer_spec(
            layer, input_shape=shape, dtype=dtype, file=layer_file, first_layer=first_layer
        )
        workload = layer_workload(spec)
    shapes = [_shape(s) for s in input_shapes] if input_shapes and len(input_shapes) > 1 else None
    if shapes or batch_sizes or shape_weights:
        workload = with_shape_set(
            workload, shapes=shapes, batch_sizes=batch_sizes, weights=shape_weights
        )
    return workload


def _shape(s: Any) -> tuple[int, ...]:
    try:
        return shape_of(s)
    except ValueError as e:
        raise AdvisorError(str(e)) from None

