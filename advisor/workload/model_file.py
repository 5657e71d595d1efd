"""Model files: a Python file (`path.py`) or a module (`package.module[:build]`) -> a model and its
example inputs, from the factories it defines (`build_model()`, `example_inputs()` by default).

User code runs here: any failure to import, build or run becomes a one-line ModelFileError. The
factories run under a fixed seed (the caller's random state untouched), so every process that
loads the same file (the advisor, its isolated workers) gets the same weights even when the file
does not seed them itself.

The calling convention (`split_inputs`): `example_inputs()` returns a tensor (one positional
input), a tuple or list (positional inputs: `model(*inputs)`), or a dict with string keys (keyword
inputs: `model(**inputs)`, for `forward(self, x, *, mask=None)`-style models). Tensors are the
values the advisor redraws (floating: fresh random values; integer and bool: kept) and moves;
anything else (a float, a string, None, a nested container) passes through unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advisor.errors import ModelFileError, check_file, first_line

__all__ = [
    "LoadedModel",
    "build_model",
    "call_tensors",
    "check_runs",
    "fresh_like",
    "load_model",
    "split_inputs",
]

_SEED = 0


@dataclass(frozen=True)
class LoadedModel:
    """A model file's model (checked to run on its example inputs) and what made it."""

    target: str
    build: str  # the factory's name (from `module:function` when the target names one)
    inputs: str
    build_fn: Callable[[], Any]
    model: nn.Module
    example: tuple[Any, ...]  # positional inputs
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword inputs

    @property
    def input_shapes(self) -> list[list[int]]:
        """Every tensor input's shape: positional ones first, then keyword ones in order."""
        return [list(x.shape) for x in call_tensors(self.example, self.kwargs)]

    @property
    def description(self) -> str:
        name = Path(self.target).name if self.target.endswith(".py") else self.target
        return f"{name} ({type(self.model).__name__})"


def load_model(
    target: str | Path, *, build: str = "build_model", inputs: str = "example_inputs"
) -> LoadedModel:
    """Import `target`, call its factories, and check the model runs on the example inputs."""
    target = str(target)
    module, build = _import_target(target, build)
    build_fn = _factory(module, build, target)
    inputs_fn = _factory(module, inputs, target)
    example, kwargs = split_inputs(_seeded(inputs_fn, f"{inputs}()"), f"{inputs}()")
    model = _built(build_fn, build)
    try:
        check_runs(model, example, kwargs)
    except Exception as e:  # noqa: BLE001 - user code: any failure is a bad input
        shapes = [tuple(x.shape) for x in call_tensors(example, kwargs)]
        raise ModelFileError(
            f"model from {target} fails on {inputs}() {shapes}: "
            f"{type(e).__name__}: {first_line(e, with_type=False)}"
        ) from None
    return LoadedModel(target, build, inputs, build_fn, model, example, kwargs)


def split_inputs(example: Any, what: str = "example_inputs()") -> tuple[tuple[Any, ...], dict]:
    """Example inputs as (positional, keyword): a tensor is one positional input, a tuple or list
    is the positional inputs, a dict with string keys is the keyword inputs (`model(**inputs)`).
    ModelFileError for anything else, or for no inputs at all."""
    if torch.is_tensor(example):
        return (example,), {}
    if isinstance(example, Mapping):
        bad = [k for k in example if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise ModelFileError(
                f"{what} returned a dict whose keys are not argument names: {bad[0]!r} "
                "(a dict is the model's keyword inputs: model(**inputs))"
            )
        if not example:
            raise ModelFileError(f"{what} returned an empty dict: no inputs")
        return (), dict(example)
    if isinstance(example, (tuple, list)) and example:
        return tuple(example), {}
    raise ModelFileError(
        f"{what} must return a tensor, a tuple of positional inputs or a dict of keyword "
        f"inputs, got {'an empty ' if isinstance(example, (tuple, list)) else ''}"
        f"{type(example).__name__}"
    )


def call_tensors(
    args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> list[torch.Tensor]:
    """The tensor inputs of a call: positional ones first, then keyword ones in order."""
    values = [*args, *(kwargs or {}).values()]
    return [x for x in values if torch.is_tensor(x)]


def build_model(target: str | Path, *, build: str = "build_model") -> nn.Module:
    """Only the model of `target` (no inputs, no check): what a layer's weights come from."""
    target = str(target)
    module, build = _import_target(target, build)
    return _built(_factory(module, build, target), build)


def _built(build_fn: Callable[[], Any], build: str) -> nn.Module:
    model = _seeded(build_fn, f"{build}()")
    if not isinstance(model, nn.Module):
        raise ModelFileError(f"{build}() must return an nn.Module, got {type(model).__name__}")
    return model


def _seeded(fn: Callable[[], Any], what: str) -> Any:
    """Call a factory under a fixed seed, restoring the caller's CPU random state after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        return _call(fn, what)


def _import_target(target: str, build: str) -> tuple[Any, str]:
    if target.endswith(".py") or "/" in target or Path(target).is_file():
        path = Path(target)
        check_file(path, "model file", ModelFileError)
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
        raise ModelFileError(f"cannot import module {modname!r}: {first_line(e)}") from None
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


def check_runs(
    model: nn.Module, example: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> None:
    """Run `model(*example, **kwargs)` once on CPU to reject bad inputs early (raises what the
    model raises).

    Tried at batch size 1 first — a full-size CPU forward of a large model can take minutes — and
    at full size only if that fails (a model may need its real batch size).
    """
    kwargs = dict(kwargs or {})
    batch = {x.shape[0] for x in call_tensors(example, kwargs) if x.dim() > 1}
    model = model.eval()

    def each(fn: Callable[[torch.Tensor], torch.Tensor], x: Any) -> Any:
        return fn(x) if torch.is_tensor(x) else x

    with torch.no_grad():
        if len(batch) == 1 and batch.pop() > 1:
            try:
                model(
                    *(each(_fresh_small, x) for x in example),
                    **{k: each(_fresh_small, v) for k, v in kwargs.items()},
                )
                return
            except Exception:  # noqa: BLE001 - decide at full size
                pass

        def full(x: torch.Tensor) -> torch.Tensor:
            return fresh_like(x, torch.Generator())

        model(*(each(full, x) for x in example), **{k: each(full, v) for k, v in kwargs.items()})


def _fresh_small(x: torch.Tensor) -> torch.Tensor:
    """The first sample of a batch: random floats, the real values of integer inputs (ids)."""
    if x.dim() <= 1:
        return x
    return fresh_like(x[:1], torch.Generator())


def fresh_like(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random values of the same shape and dtype; never zeros. Integer inputs (ids) are kept."""
    if x.is_floating_point():
        return torch.randn(x.shape, generator=gen, dtype=torch.float32).to(x.dtype)
    return x.clone()
