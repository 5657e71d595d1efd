"""Layer specs: one conv layer with its input shape, as a validated pydantic model.

A layer is written the way PyTorch users write it (`Conv2d(64, 64, 3, padding=1)`); the text is
parsed with `ast` and validated by pydantic, never evaluated. A spec also comes from a dict, a
YAML/JSON file (`layer_spec`), or a conv module inside a model (`spec_from_module`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from torch import nn
from torch.nn.parameter import is_lazy

from advisor.errors import SpecError, check_file, first_line, validation_message
from advisor.workload.layer_call import KINDS, ConvKind, parse_layer_call
from advisor.workload.sizes import INT64_MAX, check_tensor_fits, shape_of, short

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "LayerSpec",
    "layer_spec",
    "spec_from_module",
]

DtypeName = Literal["float32", "float16", "bfloat16", "float64"]
# Fields that describe what the layer is fed, not how it is built.
_NOT_CONSTRUCTOR = {"kind", "input_shape", "dtype", "input_dtype", "input_layout", "first_layer"}
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
IntOrTuple = int | tuple[int, ...]
_INT_FIELDS = (
    "in_channels",
    "out_channels",
    "groups",
    "kernel_size",
    "stride",
    "padding",
    "output_padding",
    "dilation",
    "input_shape",
)


class LayerSpec(BaseModel):
    """One conv layer with its input shape: every nn.Conv*/ConvTranspose* constructor argument."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ConvKind
    in_channels: int = Field(gt=0)
    out_channels: int = Field(gt=0)
    kernel_size: IntOrTuple
    stride: IntOrTuple = 1
    padding: IntOrTuple | Literal["same", "valid"] = 0
    output_padding: IntOrTuple = 0
    dilation: IntOrTuple = 1
    groups: int = Field(1, gt=0)
    bias: bool = True
    padding_mode: Literal["zeros", "reflect", "replicate", "circular"] = "zeros"
    input_shape: tuple[int, ...]
    dtype: DtypeName = "float32"
    # What the layer receives inside a network, when it differs from the defaults: the input's
    # dtype (e.g. bf16 activations under autocast; default: `dtype`) and layout (default: the
    # candidate's memory format). A network's first layer needs no input gradient in training.
    input_dtype: DtypeName | None = None
    input_layout: Literal["contiguous", "channels_last"] | None = None
    first_layer: bool = False

    @field_validator("kind", mode="before")
    @classmethod
    def _kind_any_case(cls, v: Any) -> Any:
        if isinstance(v, str):
            name = v.strip().removeprefix("nn.").removeprefix("torch.nn.")
            return KINDS.get(name.lower(), v)
        return v

    @field_validator("input_shape", mode="before")
    @classmethod
    def _shape_from_text(cls, v: Any) -> Any:
        return shape_of(v) if isinstance(v, str) else v

    @property
    def ndim(self) -> int:
        return int(self.kind[-2])

    @property
    def transposed(self) -> bool:
        return self.kind.startswith("ConvTranspose")

    @model_validator(mode="after")
    def _consistent(self) -> LayerSpec:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            values = value if isinstance(value, tuple) else (value,)
            if any(isinstance(x, int) and abs(x) > INT64_MAX for x in values):
                raise ValueError(f"{name} {short(value)} does not fit in a 64-bit integer")
        n = self.ndim
        for name in ("kernel_size", "stride", "dilation", "output_padding", "padding"):
            value = getattr(self, name)
            if isinstance(value, tuple) and len(value) != n:
                raise ValueError(f"{name} has {len(value)} values; {self.kind} needs {n}")
            values = value if isinstance(value, tuple) else (value,)
            if any(
                isinstance(x, int)
                and x < (1 if name in ("kernel_size", "stride", "dilation") else 0)
                for x in values
            ):
                raise ValueError(f"{name} out of range: {value}")
        if len(self.input_shape) != n + 2:
            raise ValueError(
                f"input_shape {self.input_shape} has {len(self.input_shape)} dims; "
                f"{self.kind} takes N,C plus {n} spatial dims"
            )
        if any(d <= 0 for d in self.input_shape):
            raise ValueError(f"input_shape {self.input_shape} has a non-positive dimension")
        if self.input_shape[1] != self.in_channels:
            raise ValueError(
                f"input_shape has {self.input_shape[1]} channels but in_channels={self.in_channels}"
            )
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(
                f"groups={self.groups} must divide in_channels={self.in_channels} "
                f"and out_channels={self.out_channels}"
            )
        if self.transposed and isinstance(self.padding, str):
            raise ValueError(f"padding={self.padding!r} is not supported by {self.kind}")
        if not self.transposed and self.output_padding not in (0, (0,) * n):
            raise ValueError(f"output_padding is only for ConvTranspose, not {self.kind}")
        return self

    def constructor_args(self) -> dict[str, Any]:
        """The keyword arguments of the nn module's constructor (no input, no dtype)."""
        kwargs = self.model_dump(exclude=_NOT_CONSTRUCTOR)
        if not self.transposed:
            kwargs.pop("output_padding")
        return kwargs

    # Shadows pydantic's deprecated v1 classmethod of the same name on purpose: users and the
    # benchmarks write `spec.construct()` for the module.
    def construct(self) -> nn.Module:  # type: ignore[override]
        """The nn module this spec describes (fp32, on CPU, randomly initialised)."""
        module: nn.Module = getattr(nn, self.kind)(**self.constructor_args())
        return module

    def tensors(
        self, input_shape: Sequence[int] | None = None
    ) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """(name, shape, dtype) of the tensors the layer implies on `input_shape` (default: its
        own): its input, weight and output (the output where the shape gives one)."""
        shape = tuple(input_shape) if input_shape is not None else self.input_shape
        n = self.ndim
        k, s, d = (_per_dim(getattr(self, f), n) for f in ("kernel_size", "stride", "dilation"))
        g = self.groups
        if self.transposed:
            weight = (self.in_channels, self.out_channels // g, *k)
        else:
            weight = (self.out_channels, self.in_channels // g, *k)
        dtype = DTYPES[self.dtype]
        out = [
            ("input", shape, DTYPES[self.input_dtype or self.dtype]),
            ("weight", weight, dtype),
        ]
        spatial = shape[2:]
        if len(spatial) == n:
            sizes = []
            for i, length in enumerate(spatial):
                if self.transposed:
                    p, op = _per_dim(self.padding, n)[i], _per_dim(self.output_padding, n)[i]
                    sizes.append((length - 1) * s[i] - 2 * p + d[i] * (k[i] - 1) + op + 1)
                elif self.padding == "same":
                    sizes.append(length)
                else:
                    p = 0 if self.padding == "valid" else _per_dim(self.padding, n)[i]
                    sizes.append((length + 2 * p - d[i] * (k[i] - 1) - 1) // s[i] + 1)
            if all(x > 0 for x in sizes):
                out.append(("output", (shape[0], self.out_channels, *sizes), dtype))
        return out

    def check_fits(
        self, device: str | torch.device = "cpu", input_shape: Sequence[int] | None = None
    ) -> None:
        """A one-line SpecError when a tensor the layer implies (input, weight, output) could
        never be held here: checked before anything is allocated. Inputs are made on the CPU
        first, so its RAM bounds every device."""
        for name, shape, dtype in self.tensors(input_shape):
            check_tensor_fits(f"{self.kind} {name}", shape, dtype, device)

    def build(self) -> nn.Module:
        """construct(), checked to run on the spec's input shape."""
        self.check_fits("cpu")  # the workload's example input is made on the CPU
        try:
            module = self.construct()
            with torch.no_grad():
                module(torch.randn(1, *self.input_shape[1:]))  # rejects shapes that give no output
        except (RuntimeError, ValueError) as e:
            why = first_line(e, with_type=False)
            raise SpecError(f"{self.kind} cannot run on input {self.input_shape}: {why}") from None
        return module

    def same_layer(self, other: LayerSpec) -> bool:
        """Whether `other` builds the same module (whatever either is fed)."""
        return self.kind == other.kind and self.constructor_args() == other.constructor_args()

    def describe(self) -> str:
        args = [str(self.in_channels), str(self.out_channels), _fmt(self.kernel_size)]
        default = LayerSpec.model_fields
        for name in (
            "stride",
            "padding",
            "output_padding",
            "dilation",
            "groups",
            "bias",
            "padding_mode",
        ):
            value = getattr(self, name)
            if value != default[name].default:
                args.append(f"{name}={_fmt(value)}")
        shape = "x".join(map(str, self.input_shape))
        seen: list[str] = [self.input_dtype or self.dtype]
        if self.input_layout is not None:
            seen.append(self.input_layout)
        if self.first_layer:
            seen.append("first layer")
        return f"{self.kind}({', '.join(args)}) on {shape} {' '.join(seen)}"


def _fmt(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def _per_dim(value: Any, n: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, tuple) else (value,) * n


def layer_spec(
    layer: str | dict[str, Any] | None = None,
    *,
    input_shape: str | Sequence[int] | None = None,
    dtype: str | None = None,
    file: str | Path | None = None,
    first_layer: bool = False,
) -> LayerSpec:
    """A LayerSpec from a call string, a dict, or a YAML/JSON file; one-line SpecError otherwise."""
    fields: dict[str, Any]
    if file is not None:
        fields = _load_mapping(Path(file))
    elif isinstance(layer, str):
        fields = parse_layer_call(layer)
    elif isinstance(layer, dict):
        fields = dict(layer)
    else:
        raise SpecError("no layer given: pass a layer like 'Conv2d(3, 16, 3)' or a spec file")
    if input_shape is not None:
        fields["input_shape"] = input_shape
    if dtype is not None:
        fields["dtype"] = dtype
    if first_layer:
        fields["first_layer"] = True
    if "input_shape" not in fields:
        raise SpecError("missing input shape: pass --input-shape N,C,H,W")
    try:
        spec = LayerSpec(**fields)
    except ValidationError as e:
        raise SpecError(validation_message(e, "layer spec")) from None
    except TypeError as e:
        raise SpecError(f"invalid layer spec: {first_line(e, with_type=False)}") from None
    spec.check_fits("cpu")  # its example input is made on the CPU: absurd sizes stop here
    return spec


def _load_mapping(path: Path) -> dict[str, Any]:
    check_file(path, "layer spec file", SpecError)
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise SpecError(
            f"cannot read layer spec {path}: {first_line(e, with_type=False)}"
        ) from None
    except (RecursionError, MemoryError):
        raise SpecError(f"cannot read layer spec {path}: too deeply nested") from None
    if not isinstance(data, dict):
        raise SpecError(f"layer spec {path} must be a mapping of field: value")
    if "layer" in data and isinstance(data["layer"], str):
        layer = parse_layer_call(data.pop("layer"))
        data = {**layer, **data}
    return data


def spec_from_module(
    module: nn.Module, input_shape: Sequence[int], dtype: str = "float32"
) -> LayerSpec:
    """The LayerSpec of a conv module seen with a given input shape (for per-layer timing): the
    PyTorch conv it computes, whatever its class (a parametrized, swapped or library subclass)."""
    m: Any = module
    in_channels = m.in_channels
    if not in_channels and not is_lazy(m.weight):
        # A Lazy conv given its weights by load_state_dict keeps in_channels 0: its weight says.
        in_channels = m.weight.shape[0] if m.transposed else m.weight.shape[1] * m.groups
    fields: dict[str, Any] = {
        "kind": f"{'ConvTranspose' if m.transposed else 'Conv'}{len(m.kernel_size)}d",
        "in_channels": in_channels,
        "out_channels": m.out_channels,
        "kernel_size": tuple(m.kernel_size),
        "stride": tuple(m.stride),
        "padding": m.padding if isinstance(m.padding, str) else tuple(m.padding),
        "dilation": tuple(m.dilation),
        "groups": m.groups,
        "bias": m.bias is not None,
        "padding_mode": m.padding_mode,
        "input_shape": tuple(input_shape),
        "dtype": dtype,
    }
    if m.transposed:
        fields["output_padding"] = tuple(m.output_padding)
    try:
        return LayerSpec(**fields)
    except ValidationError as e:  # e.g. a Lazy conv before its first call: in_channels 0
        raise SpecError(validation_message(e, f"{type(m).__name__} as a layer spec")) from None
