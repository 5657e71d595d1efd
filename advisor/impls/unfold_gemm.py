"""Convolution as im2col (unfold) + one batched GEMM; transposed 1-D/2-D conv as GEMM + col2im.

Backward comes from autograd through the unfold, matmul and fold ops. Memory-format aware: for a
channels-last input the columns are built with channels innermost and the GEMM writes a
channels-last output directly, so no layout copy is added around the GEMM.

Precision: the GEMM replaces a conv, so an fp32 one computes in TF32 where convs do (`conv_tf32`:
tf32="conv", PyTorch's default, and "on"), even while matmuls are IEEE: its forward and backward
matmuls then run with matmul TF32 switched on through GlobalFlags and restored right after.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from math import prod
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from advisor.impls._swap import (
    SwappingImpl,
    autocast_dtype,
    conv_out_size,
    conv_tf32,
    conv_transpose_out_size,
    ntuple,
    resolve_padding,
)
from advisor.impls.base import ConvSignature
from advisor.knobs import GlobalFlags, Settings


def is_channels_last(x: Tensor) -> bool:
    """True when channels are the innermost dim of a batched N,C,*spatial tensor (not NCHW)."""
    if x.dim() < 3 or x.is_contiguous():
        return False
    return x.permute(0, *range(2, x.dim()), 1).is_contiguous()


@contextmanager
def tf32_matmuls() -> Iterator[None]:
    """Matmul TF32 on (convs' flag and cudnn.benchmark as they are), the old flags restored."""
    with GlobalFlags() as flags:
        flags.apply(Settings(tf32="on", cudnn_benchmark=GlobalFlags.read()["cudnn_benchmark"]))
        yield


def gemm_tf32(device_type: str, dtype: torch.dtype) -> bool:
    """Whether the GEMM must switch matmul TF32 on to compute at the conv precision: CUDA fp32
    (autocast off) where convs are TF32 and matmuls are not (tf32="conv")."""
    if device_type != "cuda" or autocast_dtype(device_type) is not None:
        return False  # CPU matmuls have no TF32; under autocast the GEMM runs in 16 bits
    return conv_tf32(dtype) and not GlobalFlags.matmul_tf32()


class _Tf32Matmul(torch.autograd.Function):
    """a @ b (both at least 2-D, batch dims broadcast) with matmul TF32 on in forward and
    backward: the backward matmuls run later, outside any `with` around the forward."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        with tf32_matmuls():
            return torch.matmul(a, b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        ga = gb = None
        with tf32_matmuls():
            if ctx.needs_input_grad[0]:
                ga = torch.matmul(g, b.transpose(-1, -2)).sum_to_size(a.shape)
            if ctx.needs_input_grad[1]:
                gb = torch.matmul(a.transpose(-1, -2), g).sum_to_size(b.shape)
        return ga, gb


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    """torch.matmul at the precision the settings give convs (see `gemm_tf32`)."""
    if gemm_tf32(a.device.type, a.dtype):
        return _Tf32Matmul.apply(a, b)
    return torch.matmul(a, b)


def unfold_gemm_conv(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """Same result as F.conv{1,2,3}d(x, weight, bias, stride, padding, dilation, groups)."""
    ndim = weight.dim() - 2
    unbatched = x.dim() == ndim + 1
    if unbatched:
        x = x.unsqueeze(0)
    stride, dilation = ntuple(stride, ndim), ntuple(dilation, ndim)
    kernel = tuple(weight.shape[2:])
    pads = resolve_padding(padding, kernel, dilation, stride)
    channels_last = is_channels_last(x)
    cout, ck = weight.shape[0], weight.shape[1] * prod(kernel)
    # (G, Cout/G, Cin/G * prod(kernel)) with the K order matching the columns built below.
    # Every reshape here names all its sizes: a -1 is ambiguous on a zero batch.
    if channels_last:
        w2 = weight.permute(0, *range(2, ndim + 2), 1).reshape(groups, cout // groups, ck)
    else:
        w2 = weight.reshape(groups, cout // groups, ck)

    if all(k == 1 for k in kernel) and all(p == (0, 0) for p in pads):
        # Pointwise: the input already is the column matrix (after subsampling for stride).
        if any(s > 1 for s in stride):
            x = x[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]
        out_spatial = tuple(x.shape[2:])
        cols = _pointwise_cols(x, groups, channels_last)
    else:
        out_spatial = tuple(
            conv_out_size(n, k, s, d, p)
            for n, k, s, d, p in zip(x.shape[2:], kernel, stride, dilation, pads)
        )
        cols = _im2col(x, kernel, stride, dilation, pads, groups, channels_last)
    gemm = _gemm_channels_last if channels_last else _gemm_channels_first
    out = gemm(cols, w2, x.shape[0], out_spatial)
    if bias is not None:
        out = out + bias.to(out.dtype).view(1, -1, *([1] * ndim))
    return out.squeeze(0) if unbatched else out


def _pointwise_cols(x: Tensor, groups: int, channels_last: bool) -> Tensor:
    n, c, *spatial = x.shape
    if channels_last:
        return x.permute(0, *range(2, x.dim()), 1).reshape(n * prod(spatial), groups, c // groups)
    return x.reshape(n, groups, c // groups, prod(spatial))


def _im2col(
    x: Tensor,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    pads: list[tuple[int, int]],
    groups: int,
    channels_last: bool,
) -> Tensor:
    """Columns: (N, G, Cg*K, L) channels-first, or (N*L, G, K*Cg) channels-last."""
    ndim = len(kernel)
    n, c = x.shape[:2]
    if channels_last:
        x = x.permute(0, *range(2, ndim + 2), 1)  # N, *spatial, C: a contiguous view
        first = 1
        flat_pad = [0, 0] + [v for p in reversed(pads) for v in p]
    else:
        first = 2
        flat_pad = [v for p in reversed(pads) for v in p]
    if any(flat_pad):
        x = F.pad(x, flat_pad)
    # Tensor.unfold per spatial dim: a strided view (N, C?, *out, C?, *kernel); dilation by slicing.
    for i, (k, s, d) in enumerate(zip(kernel, stride, dilation)):
        x = x.unfold(first + i, d * (k - 1) + 1, s)
        if d > 1:
            x = x[..., ::d]
    if channels_last:
        # (N, *out, G, Cg, *kernel) -> (N, *out, G, *kernel, Cg): channels innermost.
        out = prod(x.shape[1 : ndim + 1])
        x = x.unflatten(ndim + 1, (groups, c // groups))
        x = x.permute(*range(ndim + 2), *range(ndim + 3, 2 * ndim + 3), ndim + 2)
        return x.reshape(n * out, groups, c // groups * prod(kernel))
    # (N, C, *out, *kernel) -> (N, C, *kernel, *out)
    x = x.permute(0, 1, *range(ndim + 2, 2 * ndim + 2), *range(2, ndim + 2))
    return x.reshape(n, groups, c // groups * prod(kernel), prod(x.shape[-ndim:]))


def _gemm_channels_first(cols: Tensor, w2: Tensor, n: int, out_spatial: tuple[int, ...]) -> Tensor:
    # (G, Cog, CK) @ (N, G, CK, L) -> (N, G, Cog, L): one batched GEMM, output already NC*.
    out = _matmul(w2, cols)
    return out.reshape(n, w2.shape[0] * w2.shape[1], *out_spatial)


def _gemm_channels_last(cols: Tensor, w2: Tensor, n: int, out_spatial: tuple[int, ...]) -> Tensor:
    groups, cout = w2.shape[0], w2.shape[0] * w2.shape[1]
    if groups == 1:
        out = _matmul(cols[:, 0], w2[0].t())  # (N*L, Cout): channels innermost
    else:
        out = _matmul(cols.transpose(0, 1), w2.transpose(1, 2))  # (G, N*L, Cog)
        out = out.transpose(0, 1).reshape(cols.shape[0], cout)
    out = out.view(n, *out_spatial, cout)
    return out.permute(0, -1, *range(1, len(out_spatial) + 1))  # channels-last strides


def unfold_gemm_conv_transpose(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    output_padding: int | Sequence[int] = 0,
    groups: int = 1,
    dilation: int | Sequence[int] = 1,
) -> Tensor:
    """Same result as F.conv_transpose{1,2}d: GEMM to columns, then col2im (F.fold)."""
    ndim = weight.dim() - 2
    if ndim not in (1, 2):
        raise ValueError("unfold_gemm transposed conv needs 1-D or 2-D (F.fold is 2-D only)")
    unbatched = x.dim() == ndim + 1
    if unbatched:
        x = x.unsqueeze(0)
    stride, padding = ntuple(stride, ndim), ntuple(padding, ndim)
    output_padding, dilation = ntuple(output_padding, ndim), ntuple(dilation, ndim)
    if any(op >= s for op, s in zip(output_padding, stride)):
        raise ValueError("output_padding >= stride is not supported by col2im")
    channels_last = is_channels_last(x)
    n, cin = x.shape[:2]
    kernel = tuple(weight.shape[2:])
    cog = weight.shape[1]
    out_spatial = list(map(conv_transpose_out_size, x.shape[2:], kernel, stride, padding,
                           output_padding, dilation))
    # (G, Cog*K, Cig) @ (N, G, Cig, L) -> (N, G, Cog*K, L): one batched GEMM. No -1 in the
    # reshapes: it is ambiguous on a zero batch.
    length = prod(x.shape[2:])
    w3 = weight.reshape(groups, cin // groups, cog * prod(kernel)).transpose(1, 2)
    cols = _matmul(w3, x.reshape(n, groups, cin // groups, length))
    cols = cols.reshape(n, groups * cog * prod(kernel), length)
    if ndim == 1:  # col2im is 2-D only: a 1-D conv is a 2-D one of height 1
        kernel, stride, dilation = ((1, *t) for t in (kernel, stride, dilation))
        padding = (0, *padding)
        out = F.fold(cols, (1, *out_spatial), kernel, dilation, padding, stride).squeeze(2)
    else:
        out = F.fold(cols, tuple(out_spatial), kernel, dilation, padding, stride)
    if bias is not None:
        out = out + bias.to(out.dtype).view(1, -1, *([1] * ndim))
    if channels_last and ndim == 2:
        out = out.contiguous(memory_format=torch.channels_last)
    return out.squeeze(0) if unbatched else out


class UnfoldGemmImpl(SwappingImpl):
    name = "unfold_gemm"
    description = "im2col (unfold) + one batched GEMM; transposed 1-D/2-D via GEMM + col2im"
    class_prefix = "UnfoldGemm"
    follows_recipes = True
    conv_fn = unfold_gemm_conv
    conv_transpose_fn = unfold_gemm_conv_transpose

    def call_why_not(
        self, module: nn.Module, input: Tensor, output_padding: list[int] | None
    ) -> str | None:
        # wrap checks the module's output_padding; this covers one from a changed stride.
        stride: tuple[int, ...] = module.stride  # type: ignore[assignment]
        if output_padding is not None and any(op >= s for op, s in zip(output_padding, stride)):
            return f"output_padding {output_padding} >= stride {stride} does not fit col2im"
        return super().call_why_not(module, input, output_padding)

    def layer_reason(self, sig: ConvSignature) -> str | None:
        if sig.transposed:
            if sig.ndim == 3:
                return "transposed 3-D conv needs a 3-D col2im (F.fold is 2-D only)"
            if any(op >= s for op, s in zip(sig.output_padding, sig.stride)):
                return "output_padding >= stride does not fit col2im"
        return None
