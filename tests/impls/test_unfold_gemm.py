"""unfold_gemm against torch.nn.functional: forward and every gradient, fp32 and bf16."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from advisor.impls.unfold_gemm import (
    is_channels_last,
    unfold_gemm_conv,
    unfold_gemm_conv_transpose,
)
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
