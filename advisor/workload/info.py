"""What travels with a workload: its description, typed.

A workload's `info` is written into the config file (`Config.workload`) and the study's user
attrs, hashed into the study's name (`search.study_name_for`), and sent to isolated workers, which
rebuild the workload from it (`workload.workload_from_info`). Three kinds:

- `LayerInfo`: a layer spec; with a `source` when it is a layer of a model file, so a worker
  rebuilds it with the model's weights;
- `ModelFileInfo`: a model file or module, rebuilt by importing it again;
- `ObjectInfo`: a live model given to the Python API, which no other process can rebuild.

Each may carry a shape set. The JSON (`info.model_dump(mode="json")`) is exactly the dict earlier
versions wrote: optional keys that are unset are left out, so stored studies keep their names and
old configs still load. Both model kinds say `"kind": "model"` (as they always did); a model file
is told apart by its `build` key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    SerializerFunctionWrapHandler,
    Tag,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from advisor.errors import ConfigError, validation_message
from advisor.workload.layer_spec import LayerSpec

__all__ = [
    "LayerInfo",
    "LayerSource",
    "ModelFileInfo",
    "ObjectInfo",
    "ShapeSetInfo",
    "WorkloadInfo",
    "parse_info",
]

# Keys a config file adds to the workload's info (see advice.build_advice).
CONFIG_KEYS = ("study",)


class ShapeSetInfo(BaseModel):
    """Several input shapes or batch sizes, weighted (`advisor.workload.shape_sets`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shapes: list[list[int]] | None  # the first input's shapes; or None with batch_sizes
    batch_sizes: list[int] | None
    # int | float: a weight keeps the type it was given, so the JSON (and the study name's
    # digest) stays what it was: 1 and 1.0 dump differently.
    weights: list[int | float]
    input_shapes: list[list[list[int]]]  # every tensor input's shape, per case


class LayerSource(BaseModel):
    """Where a layer of a model file lives: a worker rebuilds the model and takes its weights."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str
    build: str
    inputs: str
    module: str  # the layer's qualified name in the model, e.g. "features.0"


class _Info(BaseModel):
    """Shared by the three kinds: frozen, strict keys, unset optional keys left out of dumps."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    recreatable: ClassVar[bool] = True  # whether a worker can rebuild it from this description
    _tag: ClassVar[str]  # the union's tag: "kind" alone cannot tell the two model kinds apart
    _optional: ClassVar[tuple[str, ...]] = ("shape_set",)  # keys left out while None

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in self._optional:  # earlier versions never wrote these keys when unset
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def layer_source(self, name: str) -> LayerSource | None:
        """Where the model's layer `name` can be rebuilt with its weights; None: nowhere."""
        return None


class LayerInfo(_Info):
    """A single conv layer."""

    _tag = "layer"
    _optional = ("shape_set", "source")

    kind: Literal["layer"] = "layer"
    spec: LayerSpec
    description: str
    shape_set: ShapeSetInfo | None = None
    source: LayerSource | None = None  # None: a spec of its own, built with fresh weights


class ModelFileInfo(_Info):
    """A model from a Python file or a module: its factories' names and example input shapes."""

    _tag = "model"

    kind: Literal["model"] = "model"
    target: str  # path.py, or package.module[:build]
    build: str
    inputs: str
    input_shapes: list[list[int]]
    description: str
    shape_set: ShapeSetInfo | None = None

    def layer_source(self, name: str) -> LayerSource:
        return LayerSource(target=self.target, build=self.build, inputs=self.inputs, module=name)


class ObjectInfo(_Info):
    """A live model given to the Python API: only the process that holds it can run it."""

    _tag = "object"
    recreatable = False

    kind: Literal["model"] = "model"
    target: str  # "<ClassName object>"
    architecture: str  # a digest of repr(model): another architecture is another study
    input_shapes: list[list[int]]
    description: str
    shape_set: ShapeSetInfo | None = None


def _tag_of(value: Any) -> str | None:
    if isinstance(value, _Info):
        return value._tag
    if isinstance(value, Mapping):
        kind = value.get("kind")
        if kind == "layer":
            return "layer"
        if kind == "model":
            return "model" if "build" in value else "object"
    return None


WorkloadInfo = Annotated[
    Annotated[LayerInfo, Tag("layer")]
    | Annotated[ModelFileInfo, Tag("model")]
    | Annotated[ObjectInfo, Tag("object")],
    Discriminator(_tag_of),
]
_ADAPTER: TypeAdapter[LayerInfo | ModelFileInfo | ObjectInfo] = TypeAdapter(WorkloadInfo)


def parse_info(data: LayerInfo | ModelFileInfo | ObjectInfo | Mapping[str, Any]) -> WorkloadInfo:
    """The typed info of a workload's JSON, or of a config file's `workload` (which also names
    the study); ConfigError when it describes no workload."""
    if isinstance(data, _Info):
        return data
    fields = {k: v for k, v in data.items() if k not in CONFIG_KEYS}
    if _tag_of(fields) is None:
        raise ConfigError(f"invalid workload description: unknown kind {fields.get('kind')!r}")
    try:
        return _ADAPTER.validate_python(fields)
    except ValidationError as e:
        raise ConfigError(validation_message(e, "workload description")) from None
