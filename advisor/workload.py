"""Workloads: a single conv layer spec or a model file, turned into a model and fresh inputs.

A layer is written the way PyTorch users write it (`Conv2d(64, 64, 3, padding=1)`); the text is
parsed with `ast` and validated by pydantic, never evaluated.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from torch import nn

from advisor.errors import ModelFileError, SpecError, first_line, validation_message

ConvKind = Literal[
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"
]
_KINDS: dict[str, str] = {k.lower(): k for k in ConvKind.__args__}  # type: ignore[attr-defined]
_POSITIONAL = ("in_channels", "out_channels", "kernel_size", "stride", "padding")
_POSITIONAL_T = (*_POSITIONAL, "output_padding", "groups", "bias", "dilation")
_POSITIONAL_C = (*_POSITIONAL, "dilation", "groups", "bias")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
IntOrTuple = int | tuple[int, ...]


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
    dtype: Literal["float32", "float16", "bfloat16", "float64"] = "float32"
    # What the layer receives inside a network, when it differs from the defaults: the input's
    # dtype (e.g. bf16 activations under autocast; default: `dtype`) and layout (default: the
    # candidate's memory format). A network's first layer needs no input gradient in training.
    input_dtype: Literal["float32", "float16", "bfloat16", "float64"] | None = None
    input_layout: Literal["contiguous", "channels_last"] | None = None
    first_layer: bool = False

    @field_validator("kind", mode="before")
    @classmethod
    def _kind_any_case(cls, v: Any) -> Any:
        if isinstance(v, str):
            name = v.strip().removeprefix("nn.").removeprefix("torch.nn.")
            return _KINDS.get(name.lower(), v)
        return v

    @field_validator("input_shape", mode="before")
    @classmethod
    def _shape_from_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return tuple(int(p) for p in v.replace("x", ",").split(",") if p.strip())
            except ValueError:
                raise ValueError(f"not a comma-separated list of integers: {v!r}") from None
        return v

    @property
    def ndim(self) -> int:
        return int(self.kind[-2])

    @model_validator(mode="after")
    def _consistent(self) -> LayerSpec:
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
        if self.kind.startswith("ConvTranspose") and isinstance(self.padding, str):
            raise ValueError(f"padding={self.padding!r} is not supported by {self.kind}")
        if not self.kind.startswith("ConvTranspose") and self.output_padding not in (0, (0,) * n):
            raise ValueError(f"output_padding is only for ConvTranspose, not {self.kind}")
        return self

    def construct(self) -> nn.Module:
        """The nn module this spec describes (fp32, on CPU, randomly initialised)."""
        kwargs = self.model_dump(
            exclude={"kind", "input_shape", "dtype", "input_dtype", "input_layout", "first_layer"}
        )
        if not self.kind.startswith("ConvTranspose"):
            kwargs.pop("output_padding")
        return getattr(nn, self.kind)(**kwargs)

    def build(self) -> nn.Module:
        """construct(), checked to run on the spec's input shape."""
        try:
            module = self.construct()
            with torch.no_grad():
                module(torch.randn(1, *self.input_shape[1:]))  # rejects shapes that give no output
        except (RuntimeError, ValueError) as e:
            raise SpecError(
                f"{self.kind} cannot run on input {self.input_shape}: {first_line(e, with_type=False)}"
            ) from None
        return module

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
        seen = [self.input_dtype or self.dtype]
        if self.input_layout is not None:
            seen.append(self.input_layout)
        if self.first_layer:
            seen.append("first layer")
        return f"{self.kind}({', '.join(args)}) on {shape} {' '.join(seen)}"


def _fmt(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def check_runs(model: nn.Module, example: Sequence[Any]) -> None:
    """Run `model` once on CPU to reject bad inputs early (raises what the model raises).

    Tried at batch size 1 first — a full-size CPU forward of a large model can take minutes — and
    at full size only if that fails (a model may need its real batch size).
    """
    tensors = [x for x in example if torch.is_tensor(x)]
    batch = {x.shape[0] for x in tensors if x.dim() > 1}
    model = model.eval()
    with torch.no_grad():
        if len(batch) == 1 and batch.pop() > 1:
            small = [_fresh_small(x) if torch.is_tensor(x) else x for x in example]
            try:
                model(*small)
                return
            except Exception:  # noqa: BLE001 - decide at full size
                pass
        model(*(_fresh_like(x, torch.Generator()) if torch.is_tensor(x) else x for x in example))


def _fresh_small(x: torch.Tensor) -> torch.Tensor:
    """The first sample of a batch: random floats, the real values of integer inputs (ids)."""
    if x.dim() <= 1:
        return x
    return _fresh_like(x[:1], torch.Generator())


def parse_layer_call(text: str) -> dict[str, Any]:
    """'Conv2d(3, 16, 3, padding=1)' -> {'kind': 'Conv2d', 'in_channels': 3, ...}, without eval."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise SpecError(
            f"cannot parse layer {text!r}: expected e.g. 'Conv2d(64, 64, 3, padding=1)'"
        ) from None
    if not isinstance(node, ast.Call):
        raise SpecError(f"layer {text!r} is not a call like 'Conv2d(64, 64, 3)'")
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name is None or name.lower() not in _KINDS:
        raise SpecError(
            f"unknown layer {ast.unparse(func)!r}; expected one of {', '.join(_KINDS.values())}"
        )
    kind = _KINDS[name.lower()]
    names = _POSITIONAL_T if kind.startswith("ConvTranspose") else _POSITIONAL_C
    if len(node.args) > len(names):
        raise SpecError(
            f"{kind} takes at most {len(names)} positional arguments, got {len(node.args)}"
        )
    out: dict[str, Any] = {"kind": kind}
    items = list(zip(names, node.args, strict=False)) + [(kw.arg, kw.value) for kw in node.keywords]
    for key, value in items:
        if key is None:
            raise SpecError("**kwargs are not allowed in a layer spec")
        if key in ("device", "dtype") and key not in out:
            if key == "dtype":
                out["dtype"] = ast.unparse(value).removeprefix("torch.")
                continue
            raise SpecError("device belongs to --device, not the layer spec")
        try:
            out[key] = ast.literal_eval(value)
        except ValueError:
            raise SpecError(f"argument {key}={ast.unparse(value)} is not a literal") from None
        if isinstance(out[key], list):
            out[key] = tuple(out[key])
    return out


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
        return LayerSpec(**fields)
    except ValidationError as e:
        raise SpecError(validation_message(e, "layer spec")) from None
    except TypeError as e:
        raise SpecError(f"invalid layer spec: {e}") from None


def _load_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError(f"layer spec file not found: {path}")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise SpecError(
            f"cannot read layer spec {path}: {first_line(e, with_type=False)}"
        ) from None
    if not isinstance(data, dict):
        raise SpecError(f"layer spec {path} must be a mapping of field: value")
    if "layer" in data and isinstance(data["layer"], str):
        layer = parse_layer_call(data.pop("layer"))
        data = {**layer, **data}
    return data


# ----- model files -----


@dataclass(frozen=True)
class ShapeCase:
    """One input shape of a shape set, with its weight (how often it occurs in training)."""

    weight: float
    inputs: tuple[Any, ...]


@dataclass
class Workload:
    """Something the advisor can time: a model factory and example inputs, plus a description.

    `make_model()` returns a fresh model (fp32 weights, same values every call);
    `make_inputs(device)` returns fresh random inputs shaped like the examples.
    """

    name: str
    info: dict[str, Any]  # what goes into the config file
    make_model: Callable[[], nn.Module]
    example_inputs: tuple[Any, ...]
    cases: tuple[ShapeCase, ...] = ()  # a shape set; empty: just the example inputs
    # Which inputs need a gradient in train mode (a layer inside a network: its input is an
    # activation; a network's own inputs are data). Empty: none.
    input_grad: tuple[bool, ...] = ()
    input_layout: str | None = None  # the layout inputs arrive in; None: the candidate's format

    @property
    def is_layer(self) -> bool:
        return self.info.get("kind") == "layer"

    @functools.cached_property
    def param_dtype(self) -> torch.dtype:
        """The dtype of the model's floating parameters (a layer spec may be fp16)."""
        for p in self.make_model().parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    @property
    def shape_cases(self) -> tuple[ShapeCase, ...]:
        return self.cases or (ShapeCase(1.0, self.example_inputs),)

    def make_inputs(self, device: torch.device, seed: int = 0, case: int = 0) -> tuple[Any, ...]:
        gen = torch.Generator().manual_seed(seed)
        examples = self.shape_cases[case].inputs
        return tuple(_fresh_like(x, gen).to(device) if torch.is_tensor(x) else x for x in examples)

    @property
    def input_shapes(self) -> list[list[int]]:
        return [list(x.shape) for x in self.example_inputs if torch.is_tensor(x)]


def _fresh_like(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random values of the same shape and dtype; never zeros. Integer inputs (ids) are kept."""
    if x.is_floating_point():
        return torch.randn(x.shape, generator=gen, dtype=torch.float32).to(x.dtype)
    return x.clone()


def layer_workload(spec: LayerSpec) -> Workload:
    return _layer_workload(spec, spec.build().state_dict())


def model_workload(
    target: str | Path,
    *,
    build: str = "build_model",
    inputs: str = "example_inputs",
) -> Workload:
    """A model from a Python file (`path.py`) or a module (`package.module[:build]`)."""
    target = str(target)
    module, build = _import_target(target, build)
    build_fn = _factory(module, build, target)
    inputs_fn = _factory(module, inputs, target)
    example = _call(inputs_fn, f"{inputs}()")
    if torch.is_tensor(example):
        example = (example,)
    if not isinstance(example, (tuple, list)) or not example:
        raise ModelFileError(
            f"{inputs}() must return a tuple of tensors, got {type(example).__name__}"
        )
    example = tuple(example)
    model = _call(build_fn, f"{build}()")
    if not isinstance(model, nn.Module):
        raise ModelFileError(f"{build}() must return an nn.Module, got {type(model).__name__}")
    try:
        check_runs(model, example)
    except Exception as e:  # noqa: BLE001 - user code: any failure is a bad input
        raise ModelFileError(
            f"model from {target} fails on {inputs}() {[tuple(x.shape) for x in example if torch.is_tensor(x)]}: "
            f"{type(e).__name__}: {first_line(e, with_type=False)}"
        ) from None
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def make_model() -> nn.Module:
        m = build_fn()
        m.load_state_dict(state)
        return m

    info = {
        "kind": "model",
        "target": target,
        "build": build,
        "inputs": inputs,
        "input_shapes": [list(x.shape) for x in example if torch.is_tensor(x)],
        "description": f"{Path(target).name if target.endswith('.py') else target} ({type(model).__name__})",
    }
    return Workload(info["description"], info, make_model, example)


def _import_target(target: str, build: str) -> tuple[Any, str]:
    if target.endswith(".py") or "/" in target or Path(target).is_file():
        path = Path(target)
        if not path.is_file():
            raise ModelFileError(f"model file not found: {target}")
        name = f"_advisor_model_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ModelFileError(f"cannot import model file {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up here
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001
            sys.modules.pop(name, None)
            raise ModelFileError(
                f"model file {target} fails to import: {_describe_user_error(e, path)}"
            ) from None
        return module, build
    modname, _, func = target.partition(":")
    try:
        module = importlib.import_module(modname)
    except Exception as e:  # noqa: BLE001
        raise ModelFileError(
            f"cannot import module {modname!r}: {type(e).__name__}: {first_line(e, with_type=False)}"
        ) from None
    return module, func or build


def _factory(module: Any, name: str, target: str) -> Callable[[], Any]:
    fn = getattr(module, name, None)
    if fn is None:
        raise ModelFileError(f"{target} defines no {name}()")
    if not callable(fn):
        raise ModelFileError(f"{name} in {target} is not callable")
    return fn


def _call(fn: Callable[[], Any], what: str) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        raise ModelFileError(
            f"{what} raised {type(e).__name__}: {first_line(e, with_type=False)}"
        ) from None


def _describe_user_error(e: BaseException, path: Path) -> str:
    line = ""
    for frame in traceback.extract_tb(e.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = f" (line {frame.lineno})"
    if isinstance(e, SyntaxError):
        line = f" (line {e.lineno})"
        return f"SyntaxError: {e.msg}{line}"
    return f"{type(e).__name__}: {first_line(e, with_type=False)}{line}"


def spec_from_module(
    module: nn.Module, input_shape: Sequence[int], dtype: str = "float32"
) -> LayerSpec:
    """The LayerSpec of a conv module seen with a given input shape (for per-layer timing)."""
    m: Any = module
    fields: dict[str, Any] = {
        "kind": getattr(m, "_advisor_original_class", type(m)).__name__,
        "in_channels": m.in_channels,
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
    return LayerSpec(**fields)


def layer_workload_from_module(
    module: nn.Module,
    input_shape: Sequence[int],
    *,
    input_dtype: str | None = None,
    input_layout: str | None = None,
    input_grad: bool = True,
) -> Workload:
    """A layer workload that uses `module`'s own weights (so its numbers match the model's), fed
    the input it receives in the model: dtype, layout, and whether it needs a gradient."""
    spec = spec_from_module(module, input_shape).model_copy(
        update={
            "input_dtype": input_dtype,
            "input_layout": input_layout,
            "first_layer": not input_grad,
        }
    )
    return _layer_workload(LayerSpec.model_validate(spec.model_dump()), module.state_dict())


def _layer_workload(spec: LayerSpec, state_dict: dict[str, torch.Tensor]) -> Workload:
    state = {k: v.detach().cpu().float().clone() for k, v in state_dict.items()}

    def make_model() -> nn.Module:
        m = spec.construct()
        m.load_state_dict(state)
        return m.to(DTYPES[spec.dtype])

    example = (torch.empty(spec.input_shape, dtype=DTYPES[spec.input_dtype or spec.dtype]),)
    info = {"kind": "layer", "spec": spec.model_dump(mode="json"), "description": spec.describe()}
    return Workload(
        spec.describe(),
        info,
        make_model,
        example,
        input_grad=(not spec.first_layer,),
        input_layout=spec.input_layout,
    )


def object_workload(model: nn.Module, inputs: Any) -> Workload:
    """A workload from a live model and example inputs (the Python API)."""
    import copy

    if not isinstance(model, nn.Module):
        raise ModelFileError(f"model must be an nn.Module, got {type(model).__name__}")
    example = (inputs,) if torch.is_tensor(inputs) else tuple(inputs)
    base = copy.deepcopy(model).cpu().float()

    def make_model() -> nn.Module:
        return copy.deepcopy(base)

    shapes = [list(x.shape) for x in example if torch.is_tensor(x)]
    try:
        check_runs(copy.deepcopy(base), [x.cpu() if torch.is_tensor(x) else x for x in example])
    except Exception as e:  # noqa: BLE001
        raise ModelFileError(
            f"model fails on the example inputs {shapes}: {type(e).__name__}: {first_line(e, with_type=False)}"
        ) from None
    info = {
        "kind": "model",
        "target": f"<{type(model).__name__} object>",
        "architecture": hashlib.sha256(repr(model).encode()).hexdigest()[:12],
        "input_shapes": shapes,
        "description": f"{type(model).__name__} on {shapes}",
    }
    return Workload(
        info["description"],
        info,
        make_model,
        tuple(x.cpu() if torch.is_tensor(x) else x for x in example),
    )


def _reshaped(
    example: tuple[Any, ...], shape: Sequence[int] | None, batch: int | None
) -> tuple[Any, ...]:
    """Example inputs with the first tensor's shape replaced, or every tensor's batch size."""
    out, first = [], True
    for x in example:
        if torch.is_tensor(x):
            if shape is not None and first:
                x = torch.empty(tuple(shape), dtype=x.dtype)
            elif batch is not None and x.dim() > 0:
                x = torch.empty((batch, *x.shape[1:]), dtype=x.dtype)
            first = False
        out.append(x)
    return tuple(out)


def with_shape_set(
    workload: Workload,
    *,
    shapes: Sequence[Sequence[int]] | None = None,
    batch_sizes: Sequence[int] | None = None,
    weights: Sequence[float] | None = None,
) -> Workload:
    """The workload over several input shapes (variable image sizes) or batch sizes, weighted.

    The search's objective becomes the weighted sum of the per-shape median times.
    """
    if shapes and batch_sizes:
        raise SpecError("give several input shapes or several batch sizes, not both")
    variants: list[tuple[Sequence[int] | None, int | None]] = (
        [(s, None) for s in shapes] if shapes else [(None, b) for b in batch_sizes or []]
    )
    if len(variants) < 2 and not weights:
        return workload if not variants else _single(workload, *variants[0])
    w = list(weights) if weights else [1.0] * len(variants)
    if len(w) != len(variants):
        raise SpecError(f"{len(w)} shape weights for {len(variants)} shapes")
    if any(x <= 0 for x in w):
        raise SpecError("shape weights must be positive")
    if any(b <= 0 for _, b in variants if b is not None):
        raise SpecError("batch sizes must be positive")
    cases = tuple(
        ShapeCase(float(wi), _reshaped(workload.example_inputs, s, b))
        for wi, (s, b) in zip(w, variants, strict=True)
    )
    _check_cases(workload, cases)
    shapes_info = [[list(x.shape) for x in c.inputs if torch.is_tensor(x)] for c in cases]
    info = {
        **workload.info,
        "shape_set": {
            "shapes": [list(s) for s in shapes] if shapes else None,
            "batch_sizes": list(batch_sizes) if batch_sizes else None,
            "weights": w,
            "input_shapes": shapes_info,
        },
        "description": f"{workload.info.get('description', workload.name)} over {len(cases)} shapes",
    }
    return Workload(
        info["description"],
        info,
        workload.make_model,
        cases[0].inputs,
        cases,
        workload.input_grad,
        workload.input_layout,
    )


def _single(workload: Workload, shape: Sequence[int] | None, batch: int | None) -> Workload:
    return with_shape_set(
        workload,
        shapes=[shape] if shape else None,
        batch_sizes=[batch] if batch else None,
        weights=[1.0],
    )


def _check_cases(workload: Workload, cases: tuple[ShapeCase, ...]) -> None:
    """Every shape must run: a bad shape is bad input, not a failed trial."""
    model = workload.make_model()
    for case in cases:
        shapes = [tuple(x.shape) for x in case.inputs if torch.is_tensor(x)]
        try:
            check_runs(model, case.inputs)
        except Exception as e:  # noqa: BLE001 - user model: any failure is a bad shape
            raise SpecError(
                f"the workload fails on input shape {shapes}: {first_line(e, with_type=False)}"
            ) from None


def workload_from_info(info: dict[str, Any]) -> Workload:
    """Rebuild a workload from its description (isolated workers, `advisor worker`)."""
    if info.get("kind") == "layer":
        base = layer_workload(LayerSpec(**info["spec"]))
    elif info.get("kind") == "model" and "build" in info:
        base = model_workload(info["target"], build=info["build"], inputs=info["inputs"])
    else:
        raise ModelFileError(
            f"cannot rebuild workload {info.get('description', info)!r} in a worker"
        )
    ss = info.get("shape_set")
    if ss:
        base = with_shape_set(
            base,
            shapes=ss.get("shapes"),
            batch_sizes=ss.get("batch_sizes"),
            weights=ss.get("weights"),
        )
    return base
