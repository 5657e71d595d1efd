"""Random conv layers (hypothesis strategies) and a checker against torch.nn.functional in fp64."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, currently_in_test_context, reject
from hypothesis import strategies as st
from torch import Tensor

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@dataclass(frozen=True)
class Case:
    transposed: bool
    n: int
    cin: int
    cout: int
    size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...] | str
    dilation: tuple[int, ...]
    groups: int
    bias: bool
    channels_last: bool
    output_padding: tuple[int, ...] = ()

    @property
    def ndim(self) -> int:
        return len(self.kernel)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        if self.transposed:
            return (self.cin, self.cout // self.groups, *self.kernel)
        return (self.cout, self.cin // self.groups, *self.kernel)

    def args(self) -> tuple:
        if self.transposed:
            return (self.stride, self.padding, self.output_padding, self.groups, self.dilation)
        return (self.stride, self.padding, self.dilation, self.groups)

    @property
    def functional(self) -> Callable[..., Tensor]:
        """torch.nn.functional's version: called as fn(x, w, b, *self.args())."""
        return CONV_T[self.ndim] if self.transposed else CONV[self.ndim]

    def reference(self, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        return self.functional(x, w, b, *self.args())


def to_channels_last(x: Tensor) -> Tensor:
    """Channels innermost in memory, shape unchanged (1-D too: N,C,L stored as N,L,C)."""
    return x.movedim(1, -1).contiguous().movedim(-1, 1)


def _out_size(case: Case) -> list[int]:
    sizes = []
    for i, (n, k, s, d) in enumerate(zip(case.size, case.kernel, case.stride, case.dilation)):
        if case.transposed:
            p, op = case.padding[i], case.output_padding[i]  # type: ignore[index]
            sizes.append((n - 1) * s - 2 * p + d * (k - 1) + op + 1)
        elif case.padding == "same":
            sizes.append(n)
        else:
            p = 0 if case.padding == "valid" else case.padding[i]  # type: ignore[index]
            sizes.append((n + 2 * p - d * (k - 1) - 1) // s + 1)
    return sizes


@st.composite
def cases(
    draw: st.DrawFn,
    ndims: tuple[int, ...] = (1, 2, 3),
    transposed: bool = False,
    max_channels: int = 3,
    max_size: int = 7,
) -> Case:
    ndim = draw(st.sampled_from(ndims))
    if draw(st.booleans()):  # depthwise (or depthwise with a channel multiplier)
        groups, cig, cog = draw(st.integers(2, 4)), 1, draw(st.integers(1, 2))
    else:
        groups = draw(st.sampled_from([1, 1, 2, 3]))
        cig, cog = draw(st.integers(1, max_channels)), draw(st.integers(1, max_channels))
    dims = st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim).map(tuple)
    kernel = draw(dims)
    stride = draw(st.lists(st.integers(1, 2), min_size=ndim, max_size=ndim).map(tuple))
    dilation = draw(st.lists(st.integers(1, 2), min_size=ndim, max_size=ndim).map(tuple))
    size = draw(st.lists(st.integers(2, max_size if ndim < 3 else 5), min_size=ndim, max_size=ndim))
    output_padding: tuple[int, ...] = ()
    if transposed:
        padding = tuple(
            draw(st.integers(0, d * (k - 1) // 2)) for k, d in zip(kernel, dilation)
        )  # keeps the output positive
        output_padding = tuple(
            draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)
        )
    else:
        mode = draw(st.sampled_from(["int", "int", "same", "valid"]))
        if mode == "same" and all(s == 1 for s in stride):
            padding = "same"
        elif mode == "valid":
            padding = "valid"
        else:
            padding = draw(st.lists(st.integers(0, 2), min_size=ndim, max_size=ndim).map(tuple))
    case = Case(
        transposed=transposed,
        n=draw(st.integers(1, 2)),
        cin=cig * groups,
        cout=cog * groups,
        size=tuple(size),
        kernel=kernel,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=draw(st.booleans()),
        channels_last=draw(st.booleans()),
        output_padding=output_padding,
    )
    assume(all(o > 0 for o in _out_size(case)))
    return case


# A 16-bit native result this far from fp64 is a broken kernel, not rounding (`check`).
NATIVE_BROKEN = 0.25


def reject_unless(ok: bool) -> None:
    """Under hypothesis, discard the example unless `ok` (like `assume`); elsewhere, skip."""
    if ok:
        return
    if currently_in_test_context():
        reject()
    pytest.skip("PyTorch's own 16-bit kernel is broken for this case on this machine")


def rel_err(out: Tensor, ref: Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "NaN or Inf in the output (an element left unwritten?)"
    denom = ref.double().norm().item()
    return (out.double() - ref.double()).norm().item() / max(denom, 1e-30)


def _run(fn: Callable[..., Tensor], case: Case, tensors: list, gy: Tensor) -> list[Tensor]:
    """[output, grads...] of fn on fresh leaves copied from `tensors` (None entries skipped)."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors if t is not None]
    full = iter(leaves)
    args = [next(full) if t is not None else None for t in tensors]
    out = fn(*args, *case.args())
    out.backward(gy.to(out.dtype))
    return [out.detach(), *(leaf.grad for leaf in leaves)]  # type: ignore[misc]


def draw_inputs(
    case: Case, dtype: torch.dtype, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The input, weight and bias `check` runs a case on, drawn from `gen` and rounded to `dtype`
    (the input channels_last where the case says so)."""
    x = torch.randn(case.n, case.cin, *case.size, generator=gen).to(dtype)
    w = torch.randn(case.weight_shape, generator=gen).to(dtype)
    b = torch.randn(case.cout, generator=gen).to(dtype) if case.bias else None
    return (to_channels_last(x) if case.channels_last else x), w, b


def check(
    fn: Callable[..., Tensor],
    case: Case,
    dtype: torch.dtype = torch.float32,
    tol: float | None = None,
    seed: int = 0,
) -> None:
    """fn(x, w, b, *case.args()) matches the fp64 reference forward and in every gradient.

    Inputs are rounded to `dtype` first, so the reference sees exactly what fn sees. For 16-bit
    dtypes the bound is also at least twice PyTorch's own error in that dtype: on tiny layers a
    sum that cancels can leave any 16-bit result far (relatively) from the fp64 one.
    """
    tol = TOL[dtype] if tol is None else tol
    gen = torch.Generator().manual_seed(seed)
    x, w, b = draw_inputs(case, dtype, gen)
    ref_out = case.reference(x.double(), w.double(), b.double() if b is not None else None)
    gy = torch.randn(ref_out.shape, generator=gen).to(dtype).double()
    tensors = [x, w, b]
    ref = _run(case.functional, case, [t.double() if t is not None else None for t in tensors], gy)
    bounds = [tol] * len(ref)
    if dtype != torch.float32:
        native = _run(case.functional, case, tensors, gy)
        # PyTorch's own 16-bit kernel can be broken for a case on a machine: on a Sapphire Rapids
        # (AMX), torch 2.13's bf16 conv with a kernel and stride of 2 over a width of 3 (the last
        # column unread) is 45-95% off, and now and then leaves NaN in its output. Such a case
        # is PyTorch's bug, and nothing to measure an implementation against: not drawn.
        reject_unless(all(bool(torch.isfinite(n).all()) for n in native)
                      and max(rel_err(n, r) for n, r in zip(native, ref)) < NATIVE_BROKEN)  # fmt: skip
        bounds = [max(tol, 2 * rel_err(n, r)) for n, r in zip(native, ref)]
    got = _run(fn, case, tensors, gy)
    assert got[0].dtype == dtype
    names = ["output", "input grad", "weight grad", "bias grad"]
    for name, g, r, bound in zip(names, got, ref, bounds):
        err = rel_err(g, r)
        assert err < bound, f"{name}: relative error {err:.2e} >= {bound:.2e} for {case}"
