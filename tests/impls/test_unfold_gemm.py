"""unfold_gemm against torch.nn.functional: forward and every gradient, fp32 and bf16."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from torch.utils._python_dispatch import TorchDispatchMode

from advisor.impls import unfold_gemm
from advisor.impls.unfold_gemm import (
    is_channels_last,
    unfold_gemm_conv,
    unfold_gemm_conv_transpose,
)
from advisor.knobs import GlobalFlags, Settings
from tests.impls.conv_cases import Case, cases, check, to_channels_last

FAST = settings(max_examples=40, deadline=None)


@FAST
@given(cases())
def test_conv_fp32(case: Case) -> None:
    check(unfold_gemm_conv, case)


@settings(max_examples=25, deadline=None)
@given(cases())
def test_conv_bf16(case: Case) -> None:
    check(unfold_gemm_conv, case, torch.bfloat16)


@FAST
@given(cases(ndims=(1, 2), transposed=True))
def test_conv_transpose_fp32(case: Case) -> None:
    if any(op >= s for op, s in zip(case.output_padding, case.stride)):
        with pytest.raises(ValueError, match="output_padding"):
            check(unfold_gemm_conv_transpose, case)
        return
    check(unfold_gemm_conv_transpose, case)


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("groups", [1, 2])
def test_channels_last_in_channels_last_out(ndim: int, kernel: int, groups: int) -> None:
    x = to_channels_last(torch.randn(2, 4, *[6] * ndim))
    w = torch.randn(6, 4 // groups, *[kernel] * ndim)
    out = unfold_gemm_conv(x, w, None, 1, kernel // 2, 1, groups)
    assert is_channels_last(out)


def test_pointwise_channels_last_is_one_matmul_over_channels() -> None:
    x = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    w = torch.randn(4, 8, 1, 1)
    out = unfold_gemm_conv(x, w)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, torch.nn.functional.conv2d(x, w))


def test_unbatched_input() -> None:
    x, w = torch.randn(3, 7, 7), torch.randn(4, 3, 3, 3)
    torch.testing.assert_close(
        unfold_gemm_conv(x, w, padding=1), torch.nn.functional.conv2d(x, w, padding=1)
    )


def test_the_gemm_computes_at_the_conv_precision() -> None:
    """A CUDA fp32 GEMM needs matmul TF32 switched on exactly where convs are TF32 and matmuls
    are not: tf32="conv" (PyTorch's default). "off" stays IEEE; under "on" it already is TF32."""
    with GlobalFlags() as flags:
        for tf32, want in (("off", False), ("conv", True), ("on", False)):
            flags.apply(Settings(tf32=tf32))
            assert unfold_gemm.gemm_tf32("cuda", torch.float32) is want, tf32
            assert not unfold_gemm.gemm_tf32("cuda", torch.bfloat16)
            assert not unfold_gemm.gemm_tf32("cpu", torch.float32)  # no TF32 on a CPU


_GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default}


class _MatmulFlags(TorchDispatchMode):
    """Records GlobalFlags.matmul_tf32() at every GEMM kernel call, backward's included."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _GEMMS:
            self.seen.append(GlobalFlags.matmul_tf32())
        return func(*args, **(kwargs or {}))


def test_the_tf32_gemm_switches_matmul_tf32_on_and_restores_it() -> None:
    # The shapes of the channels-first GEMM: (G, Cog, CK) @ (N, G, CK, L), batch broadcast.
    a = torch.randn(2, 3, 5, requires_grad=True)
    b = torch.randn(4, 2, 5, 6, requires_grad=True)
    g = torch.randn(4, 2, 3, 6)
    with GlobalFlags() as flags:
        flags.apply(Settings(tf32="conv"))
        assert not GlobalFlags.matmul_tf32()
        mode = _MatmulFlags()
        with mode:
            out = unfold_gemm._Tf32Matmul.apply(a, b)
            assert not GlobalFlags.matmul_tf32()  # restored after the forward
            ga, gb = torch.autograd.grad(out, (a, b), g)
        assert mode.seen == [True, True, True]  # forward, and both backward matmuls
        plain = _MatmulFlags()
        with plain:
            torch.matmul(a, b)
        assert plain.seen == [False]  # a plain matmul under tf32="conv" is IEEE
        assert not GlobalFlags.matmul_tf32() and GlobalFlags.conv_tf32()  # as before
    want = torch.matmul(a, b)
    torch.testing.assert_close(out, want)
    for got, exp in zip((ga, gb), torch.autograd.grad(want, (a, b), g)):
        torch.testing.assert_close(got, exp)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "kwargs", "channels_last"),
    [
        ((0, 3, 7), (4, 3, 3), {"padding": 1}, False),
        ((0, 3, 7, 5), (4, 3, 3, 2), {}, False),
        ((0, 4, 6, 5), (6, 2, 3, 3), {"groups": 2, "stride": 2}, True),
        ((0, 4, 6, 5), (6, 2, 1, 1), {"groups": 2}, False),  # pointwise
        ((0, 4, 6, 5), (6, 4, 1, 1), {}, True),
        ((0, 2, 3, 4, 4), (4, 2, 2, 3, 3), {"padding": (0, 1, 1)}, False),
    ],
)
def test_zero_batch(x_shape: tuple, w_shape: tuple, kwargs: dict, channels_last: bool) -> None:
    """A zero batch computes: the right (empty) output and zero weight and bias gradients."""
    x = torch.randn(x_shape)
    if channels_last:
        x = to_channels_last(x)
    w, b = torch.randn(w_shape, requires_grad=True), torch.randn(w_shape[0], requires_grad=True)
    ref = getattr(torch.nn.functional, f"conv{len(w_shape) - 2}d")(x, w, b, **kwargs)
    out = unfold_gemm_conv(x.requires_grad_(), w, b, **kwargs)
    assert out.shape == ref.shape
    gx, gw, gb = torch.autograd.grad(out.sum(), (x, w, b))
    assert gx.shape == x.shape and not gw.any() and not gb.any()


@pytest.mark.parametrize("ndim", [1, 2])
def test_zero_batch_transpose(ndim: int) -> None:
    x = torch.randn(0, 4, *[3] * ndim, requires_grad=True)
    w = torch.randn(4, 3, *[2] * ndim, requires_grad=True)
    ref = getattr(torch.nn.functional, f"conv_transpose{ndim}d")(x, w, None, 2)
    out = unfold_gemm_conv_transpose(x, w, None, 2)
    assert out.shape == ref.shape
    gx, gw = torch.autograd.grad(out.sum(), (x, w))
    assert gx.shape == x.shape and not gw.any()
