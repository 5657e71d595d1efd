"""Exact rewrites: the same arithmetic as the layer, expressed with ops that run faster.

- fold_time: a Conv3d whose kernel is 1 along time is a Conv2d over (batch x time) frames. The
  Conv2d backward is the faster one (2-3x on CUDA in the Conv3d seed case), and a
  channels_last_3d input folds to a channels_last 2-D batch without a copy.
- transpose_as_mul: a ConvTranspose with stride == kernel, no padding and dilation 1 has no
  overlapping windows, so each input pixel writes its own output block: a broadcast multiply
  (depthwise) or an einsum (general groups), then a reshape. No col2im, no atomics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from advisor.impls._swap import SwappingImpl, cast_for_autocast, conv_weight, ntuple
from advisor.impls.base import ConvSignature
from advisor.impls.unfold_gemm import is_channels_last

# ---- fold_time ----------------------------------------------------------------------------------


def fold_time_conv3d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """F.conv3d for a kernel of temporal size 1 (temporal stride 1, no temporal padding)."""
    stride, dilation = ntuple(stride, 3), ntuple(dilation, 3)
    if not isinstance(padding, str):
        padding = ntuple(padding, 3)
    reason = _fold_time_reason(tuple(weight.shape[2:]), stride, padding)
    if reason is not None:
        raise ValueError(f"fold_time does not apply: {reason}")
    unbatched = x.dim() == 4
    if unbatched:
        x = x.unsqueeze(0)
    n, c, t, h, w = x.shape
    # N,C,T,H,W -> N*T,C,H,W. A view (channels_last 2-D) for channels_last_3d input, else a copy.
    frames = x.transpose(1, 2).reshape(n * t, c, h, w)
    pad2d = padding if isinstance(padding, str) else padding[1:]
    out = F.conv2d(frames, weight[:, :, 0], bias, stride[1:], pad2d, dilation[1:], groups)
    out = out.unflatten(0, (n, t)).transpose(1, 2)
    # Keep the memory format nn.Conv3d would give: channels_last_3d in, channels_last_3d out.
    fmt = torch.channels_last_3d if is_channels_last(x) else torch.contiguous_format
    out = out.contiguous(memory_format=fmt)
    return out.squeeze(0) if unbatched else out


def _fold_time_reason(
    kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...] | str
) -> str | None:
    if kernel[0] != 1:
        return f"temporal kernel is {kernel[0]}, not 1"
    if stride[0] != 1:
        return f"temporal stride is {stride[0]}, not 1"
    if not isinstance(padding, str) and padding[0] != 0:
        return f"temporal padding is {padding[0]}, not 0"
    return None  # dilation is irrelevant along an axis of kernel size 1


class FoldTimeImpl(SwappingImpl):
    name = "fold_time"
    description = "Conv3d with a (1,k,k) kernel as Conv2d over batch x time"
    class_prefix = "FoldTime"
    follows_recipes = True
    conv_fn = fold_time_conv3d  # F.conv3d's argument order: the default module_forward fits

    def layer_reason(self, sig: ConvSignature) -> str | None:
        if sig.kind != "Conv3d":
            return f"only Conv3d qualifies, not {sig.kind}"
        if sig.padding_mode != "zeros":
            return f"padding_mode {sig.padding_mode!r} pads time too; only 'zeros' qualifies"
        return _fold_time_reason(sig.kernel_size, sig.stride, sig.padding)


# ---- transpose_as_mul ---------------------------------------------------------------------------


def transpose_as_mul(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] | None = None,
    groups: int = 1,
) -> Tensor:
    """F.conv_transpose{1,2,3}d for stride == kernel, padding 0, dilation 1, output_padding 0."""
    ndim = weight.dim() - 2
    kernel = tuple(weight.shape[2:])
    if stride is not None and ntuple(stride, ndim) != kernel:
        raise ValueError(f"transpose_as_mul needs stride == kernel_size {kernel}, got {stride}")
    unbatched = x.dim() == ndim + 1
    if unbatched:
        x = x.unsqueeze(0)
    x, weight, bias = cast_for_autocast(x, weight, bias)  # type: ignore[assignment]
    channels_last = is_channels_last(x)
    n, cin, *size = x.shape
    cog = weight.shape[1]
    # Output dims, channels-first: (N, G, Cog, I1, K1, I2, K2, ...); channels-last puts (G, Cog)
    # last, so the product is written in the layout the output has and the reshape is free.
    if groups == cin:
        out = _depthwise_mul(x, weight, channels_last)
    else:
        out = _grouped_einsum(x, weight, groups, channels_last)
    out_size = [i * k for i, k in zip(size, kernel)]
    if channels_last:
        out = out.reshape(n, *out_size, groups * cog).permute(0, ndim + 1, *range(1, ndim + 1))
    else:
        out = out.reshape(n, groups * cog, *out_size)
    if bias is not None:
        out = out + bias.view(1, -1, *([1] * ndim))
    return out.squeeze(0) if unbatched else out


def _interleave(spatial: Sequence[int], kernel: Sequence[int], take_i: bool) -> list[int]:
    """Sizes for (I1, K1, I2, K2, ...) with 1 in the slots the tensor does not cover."""
    return [v for i, k in zip(spatial, kernel) for v in ((i, 1) if take_i else (1, k))]


def _depthwise_mul(x: Tensor, weight: Tensor, channels_last: bool) -> Tensor:
    n, c, *size = x.shape
    mult, *kernel = weight.shape[1:]
    ndim = len(size)
    if channels_last:
        # x: N, I.., C -> (N, I1,1, I2,1, .., C, 1); w: C, M, K.. -> (1, 1,K1, 1,K2, .., C, M)
        xv = x.permute(0, *range(2, ndim + 2), 1).reshape(n, *_interleave(size, kernel, True), c, 1)
        wv = weight.permute(*range(2, ndim + 2), 0, 1)
        wv = wv.reshape(1, *_interleave(size, kernel, False), c, mult)
    else:
        xv = x.reshape(n, c, 1, *_interleave(size, kernel, True))
        wv = weight.reshape(1, c, mult, *_interleave(size, kernel, False))
    return xv * wv


def _grouped_einsum(x: Tensor, weight: Tensor, groups: int, channels_last: bool) -> Tensor:
    n, cin, *size = x.shape
    cog, *kernel = weight.shape[1:]
    ndim = len(size)
    spatial_in, kernel_letters = "ijk"[:ndim], "abd"[:ndim]
    interleaved = "".join(i + k for i, k in zip(spatial_in, kernel_letters))
    out_spec = f"n{interleaved}go" if channels_last else f"ngo{interleaved}"
    xg = x.reshape(n, groups, cin // groups, *size)
    wg = weight.reshape(groups, cin // groups, cog, *kernel)
    return torch.einsum(f"ngc{spatial_in},gco{kernel_letters}->{out_spec}", xg, wg)


class TransposeAsMulImpl(SwappingImpl):
    name = "transpose_as_mul"
    description = "ConvTranspose with stride == kernel (no overlap) as broadcast multiply / einsum"
    class_prefix = "TransposeAsMul"
    follows_recipes = True

    def layer_reason(self, sig: ConvSignature) -> str | None:
        if not sig.transposed:
            return f"only transposed convs qualify, not {sig.kind}"
        if sig.stride != sig.kernel_size:
            return f"stride {sig.stride} != kernel_size {sig.kernel_size}: windows overlap"
        if any(p != 0 for p in sig.padding):
            return f"padding {sig.padding} crops the output"
        if any(d != 1 for d in sig.dilation):
            return f"dilation {sig.dilation} is not 1"
        if any(op != 0 for op in sig.output_padding):
            return f"output_padding {sig.output_padding} is not 0"
        return None

    def call_why_not(
        self, module: nn.Module, input: Tensor, output_padding: list[int] | None
    ) -> str | None:
        # An output_size= larger than input * stride (U-Net decoders pass one): the extra rows
        # are bias only, which the block-per-pixel product does not write.
        if output_padding is not None and any(output_padding):
            return f"output_size needs output_padding {output_padding}"
        return super().call_why_not(module, input, output_padding)

    def module_forward(
        self,
        module: nn.Module,
        input: Tensor,
        padding: tuple[int, ...] | str,
        output_padding: list[int] | None,
    ) -> Tensor:
        m: nn.modules.conv._ConvNd = module  # type: ignore[assignment]
        assert not output_padding or not any(output_padding), "call_why_not lets none through"
        return transpose_as_mul(input, conv_weight(m), m.bias, m.stride, m.groups)
