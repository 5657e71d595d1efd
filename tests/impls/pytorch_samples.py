"""PyTorch's own conv samples, drawn from `torch.testing._internal` as module calls.

The OpInfos of nn.functional.conv{1,2,3}d and conv_transpose{1,2,3}d (`op_db`: a functional
sample becomes the nn.Conv* module with its weight, bias, stride, padding, dilation, groups and
output_padding) and the ModuleInfos of nn.Conv*, nn.ConvTranspose* and their Lazy variants
(`module_db`), each also in the forms a layer's forward meets (`_variants`).

`torch.testing._internal` is PyTorch's own test harness, private, and importing it changes the
process (see `_quarantine`): `load_databases` undoes that, and says why when it cannot load.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

import torch
from torch import Tensor, nn

from tests.impls.conv_cases import to_channels_last

CPU = torch.device("cpu")
_CONV_ARGS = ("stride", "padding", "dilation", "groups")
_CONV_T_ARGS = ("stride", "padding", "output_padding", "groups", "dilation")


@dataclass
class Sample:
    name: str
    build: Callable[[], nn.Module]  # the PyTorch module, float64
    x: Tensor  # the input as drawn, float64
    kwargs: dict[str, Any] = field(default_factory=dict)
    layout: Callable[[Tensor], Tensor] = lambda t: t  # noqa: E731

    def input(self, dtype: torch.dtype) -> Tensor:
        return self.layout(self.x.detach().to(dtype)).requires_grad_()


@contextmanager
def _quarantine() -> Iterator[None]:
    """Undo what the first import of torch.testing._internal does to this process: it freezes
    torch.backends flags (GlobalFlags could no longer apply settings), loads its own hypothesis
    profile (the suite's would lose derandomize), sets TORCHINDUCTOR_CACHE_DIR, wraps TorchScript
    calls, and adds to sys.path and the warning filters."""
    frozen = torch.backends.flags_frozen()
    env, path = dict(os.environ), list(sys.path)
    script_calls = (torch._C.ScriptFunction.__call__, torch._C.ScriptMethod.__call__)
    try:
        import hypothesis

        profile: str | None = hypothesis.settings.get_current_profile_name()
    except ImportError:
        profile = None
    try:
        with warnings.catch_warnings():
            yield
    finally:
        if not frozen:  # the global torch.backends.disable_global_flags() clears
            torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
        for key in set(os.environ) - set(env):
            del os.environ[key]
        os.environ.update(env)
        sys.path[:] = path
        torch._C.ScriptFunction.__call__, torch._C.ScriptMethod.__call__ = script_calls  # type: ignore[method-assign]
        if profile is not None:
            hypothesis.settings.load_profile(profile)


@cache
def load_databases() -> tuple[list[Any], list[Any]] | str:
    """(op_db, module_db), or why they cannot be loaded here (a private API, needing expecttest)."""
    try:
        with _quarantine():
            from torch.testing._internal.common_methods_invocations import op_db
            from torch.testing._internal.common_modules import module_db
    except Exception as exc:  # private: any torch version may move it, or lack its test deps
        return f"torch.testing._internal is not usable: {type(exc).__name__}: {exc}"
    return op_db, module_db


def module_from_functional(op_name: str, sample: Any) -> Callable[..., nn.Module]:
    """The nn.Conv*/nn.ConvTranspose* module computing `op(input, *args, **kwargs)`."""
    transposed = "transpose" in op_name
    weight, bias, *rest = (*sample.args, None)[: max(len(sample.args), 2)]
    names = _CONV_T_ARGS if transposed else _CONV_ARGS
    args = {**dict(zip(names, rest)), **sample.kwargs}
    groups = args.get("groups", 1)
    ndim = weight.dim() - 2
    cls = getattr(nn, f"{'ConvTranspose' if transposed else 'Conv'}{ndim}d")
    cin, cout = (weight.shape[0], weight.shape[1] * groups)
    if not transposed:
        cin, cout = weight.shape[1] * groups, weight.shape[0]

    def build(**extra: Any) -> nn.Module:
        kwargs = {**args, **extra}
        module = cls(cin, cout, tuple(weight.shape[2:]), bias=bias is not None, **kwargs)
        module = module.to(torch.float64)
        with torch.no_grad():
            module.weight.copy_(weight)
            if bias is not None:
                module.bias.copy_(bias)
        return module

    return build


def _functional_samples(op_db: list[Any]) -> Iterator[tuple[str, Callable[..., nn.Module], Tensor]]:
    for op in op_db:
        if op.name.startswith("nn.functional.conv"):
            for i, s in enumerate(op.sample_inputs(CPU, torch.float64, requires_grad=True)):
                yield f"{op.name}#{i}", module_from_functional(op.name, s), s.input


def _module_samples(module_db: list[Any]) -> Iterator[tuple[str, Callable[..., nn.Module], Tensor]]:
    for info in module_db:
        if not info.module_cls.__name__.startswith(("Conv", "LazyConv")):
            continue
        inputs = info.module_inputs_func(
            info, device=CPU, dtype=torch.float64, requires_grad=True, training=True
        )
        for i, mi in enumerate(inputs):
            ctor = mi.constructor_input

            def build(cls: type = info.module_cls, ctor: Any = ctor, **extra: Any) -> nn.Module:
                return cls(*ctor.args, **{**ctor.kwargs, **extra}, dtype=torch.float64)

            assert not mi.forward_input.kwargs, mi.forward_input.kwargs
            yield f"{info.module_cls.__name__}#{i}", build, mi.forward_input.args[0]


def _variants(name: str, build: Callable[..., nn.Module], x: Tensor) -> Iterator[Sample]:
    """The sample as drawn, then in the other forms a layer's forward meets."""
    from torch.testing._internal.common_utils import noncontiguous_like

    conv: nn.modules.conv._ConvNd = build()  # type: ignore[assignment]
    yield Sample(name, build, x)
    yield Sample(f"{name}/noncontiguous", build, x, layout=noncontiguous_like)
    if x.dim() == len(conv.kernel_size) + 2:  # batched
        yield Sample(f"{name}/channels_last", build, x, layout=to_channels_last)
        yield Sample(f"{name}/zero_batch", build, x[:0])
    if conv.transposed:
        yield from _output_sizes(name, build, x)
        # Derived: the same weights and input without overlapping windows (stride == kernel),
        # the layer transpose_as_mul takes; none of PyTorch's samples is one.
        kernel = tuple(conv.kernel_size)
        flat = partial(build, stride=kernel, padding=0, dilation=1, output_padding=0)
        yield Sample(f"{name}/stride=kernel", flat, x)
        yield from _output_sizes(f"{name}/stride=kernel", flat, x)
    elif not isinstance(conv.padding, str) and any(conv.padding):
        for mode in ("reflect", "replicate", "circular"):
            yield Sample(f"{name}/{mode}", partial(build, padding_mode=mode), x)


def _output_sizes(name: str, build: Callable[..., nn.Module], x: Tensor) -> Iterator[Sample]:
    """output_size= for a transposed conv: the largest size (output_padding stride - 1) as a list
    of spatial sizes, and the smallest as a full torch.Size (batch and channel dims too)."""
    conv: nn.modules.conv._ConvNd = build()  # type: ignore[assignment]
    ndim = len(conv.kernel_size)
    smallest = [
        (i - 1) * s - 2 * p + d * (k - 1) + 1
        for i, s, p, d, k in zip(
            x.shape[-ndim:], conv.stride, conv.padding, conv.dilation, conv.kernel_size
        )
    ]
    largest = [n + s - 1 for n, s in zip(smallest, conv.stride)]
    full = torch.Size([*x.shape[: -ndim - 1], conv.out_channels, *smallest])
    yield Sample(f"{name}/output_size_list", build, x, {"output_size": largest})
    yield Sample(f"{name}/output_size_Size", build, x, {"output_size": full})


@cache
def samples() -> list[Sample] | str:
    """Every sample and variant, or why there are none here."""
    dbs = load_databases()
    if isinstance(dbs, str):
        return dbs
    op_db, module_db = dbs
    drawn = [*_functional_samples(op_db), *_module_samples(module_db)]
    if not drawn:
        return "torch.testing._internal has no conv OpInfos or ModuleInfos"
    return [v for name, build, x in drawn for v in _variants(name, build, x)]
