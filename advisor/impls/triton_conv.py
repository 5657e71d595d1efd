"""Triton implicit-GEMM convolution: forward, grad input and grad weight are Triton kernels.

Covers Conv1d/2d/3d and ConvTranspose1d/2d/3d with any stride, padding (ints, 'same', 'valid'),
dilation, groups, output_padding and bias, in fp32 (TF32 where PyTorch's conv TF32 flag is on, as
for the cuDNN conv it replaces), fp16 and bf16 (fp32 accumulation), for contiguous and
channels-last tensors (via strides).
A transposed conv is the grad-input of a plain conv, so the three kernels serve both directions.

Triton is imported lazily (`triton_loader`): `import advisor.impls` must not pay for it, and
`why_not` reports a missing or too old triton instead of raising.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from advisor.device.ops import cuda_ops, device_guard
from advisor.impls._swap import (
    SwappingImpl,
    autocast_dtype,
    cast_for_autocast,
    conv_out_size,
    conv_tf32,
    conv_transpose_out_size,
    ntuple,
    resolve_padding,
)
from advisor.impls.base import ConvSignature
from advisor.impls.classes import weight_dtype
from advisor.impls.triton_configs import too_thin
from advisor.impls.triton_loader import device_problem, interpreting, kernels
from advisor.impls.unfold_gemm import is_channels_last

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_GRID_YZ = 65535  # CUDA limit on grid axes 1 and 2

# Test hook: fill every output buffer with NaN before the kernels write it, so an element a kernel
# forgets to write shows up as NaN instead of as leftover memory.
POISON_OUTPUTS = False

# ---- geometry and buffers -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Geometry:
    """Conv arguments padded to 3 spatial dims (depth, height, width); pad is the left pad."""

    stride: tuple[int, int, int]
    pad: tuple[int, int, int]
    dilation: tuple[int, int, int]
    groups: int

    @classmethod
    def make(
        cls, stride: Sequence[int], pad: Sequence[int], dilation: Sequence[int], groups: int
    ) -> _Geometry:
        fill = 3 - len(stride)
        return cls(
            (1,) * fill + tuple(stride),  # type: ignore[arg-type]
            (0,) * fill + tuple(pad),  # type: ignore[arg-type]
            (1,) * fill + tuple(dilation),  # type: ignore[arg-type]
            groups,
        )

    @property
    def args(self) -> tuple[int, ...]:
        return (*self.stride, *self.pad, *self.dilation)


def _to5d(t: Tensor) -> Tensor:
    """N, C, *spatial (1-3 dims) -> N, C, D, H, W as a view (unit dims in front)."""
    while t.dim() < 5:
        t = t.unsqueeze(2)
    return t


def _from5d(t: Tensor, ndim: int) -> Tensor:
    return t.flatten(1, 4 - ndim) if ndim < 3 else t  # unit dims: a view


def _empty(shape: Sequence[int], like: Tensor, channels_last: bool, dtype: torch.dtype) -> Tensor:
    """A buffer on `like`'s device; 5-D, channels innermost, when `channels_last` (its layout)."""
    n, c, *spatial = shape
    if channels_last:
        out = torch.empty((n, *spatial, c), device=like.device, dtype=dtype).permute(0, 4, 1, 2, 3)
    else:
        out = torch.empty(tuple(shape), device=like.device, dtype=dtype)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: 'tf32' for fp32 where convs compute in TF32 (`conv_tf32`: the
    conv flag, asked of GlobalFlags, which never mixes PyTorch's two TF32 APIs), else 'ieee'
    (ignored by tl.dot for 16-bit inputs)."""
    return "tf32" if conv_tf32(dtype) else "ieee"


def _flags(dtype: torch.dtype) -> dict[str, Any]:
    # The interpreter's tl.dot multiplies bf16 bit patterns as integers: upcast there (exact,
    # since a bf16 x bf16 product fits fp32, the same as the hardware's fp32 accumulation).
    upcast = interpreting() and dtype == torch.bfloat16
    return {"PRECISION": _precision(dtype), "UPCAST": upcast}


# ---- the three kernel launches (all tensors 5-D) ------------------------------------------------


def _gemm_grid(m: int, n: int, groups: int) -> Callable[[dict[str, int]], tuple[int, int, int]]:
    """The forward and grad-input launch grid: tiles of `m` positions by `n` channels, per group."""

    def grid(meta: dict[str, int]) -> tuple[int, int, int]:
        return (triton_cdiv(m, meta["BLOCK_M"]), triton_cdiv(n, meta["BLOCK_N"]), groups)

    return grid


def _forward(
    x: Tensor, w: Tensor, b: Tensor | None, geo: _Geometry, out_spatial: Sequence[int]
) -> Tensor:
    """y = conv(x, w) + b, with output spatial size `out_spatial`."""
    k = kernels()
    n, _, d, h, wd = x.shape
    cout, cgi = w.shape[:2]
    cgo = cout // geo.groups
    y = _empty((n, cout, *out_spatial), x, is_channels_last(x), x.dtype)
    m = n * out_spatial[0] * out_spatial[1] * out_spatial[2]
    with device_guard(x.device):  # Triton launches on the current device
        k.conv_fwd_kernel[_gemm_grid(m, cgo, geo.groups)](
            x, w, b if b is not None else w, y,
            m, d, h, wd, *out_spatial, *w.shape[2:], *geo.args, cgi, cgo,
            *x.stride(), *w.stride(), *y.stride(),
            HAS_BIAS=b is not None, **_flags(x.dtype),
        )  # fmt: skip
    return y


def _grad_input(
    gy: Tensor, w: Tensor, b: Tensor | None, geo: _Geometry, in_spatial: Sequence[int], like: Tensor
) -> Tensor:
    """gx = conv's grad-input for grad-output `gy` (plus b: a transposed conv's forward)."""
    k = kernels()
    n, cout = gy.shape[:2]
    cgi = w.shape[1]
    cgo = cout // geo.groups
    gx = _empty((n, cgi * geo.groups, *in_spatial), gy, is_channels_last(like), gy.dtype)
    m = n * in_spatial[0] * in_spatial[1] * in_spatial[2]
    with device_guard(gy.device):  # Triton launches on the current device
        k.conv_dgrad_kernel[_gemm_grid(m, cgi, geo.groups)](
            gy, w, b if b is not None else w, gx,
            m, *in_spatial, *gy.shape[2:], *w.shape[2:], *geo.args, cgi, cgo,
            *gy.stride(), *w.stride(), *gx.stride(),
            HAS_BIAS=b is not None, **_flags(gy.dtype),
        )  # fmt: skip
    return gx


def _split_count(p: int, base_programs: int, device: torch.device) -> int:
    """How many ways to split the grad-weight reduction so the GPU has enough programs."""
    if device.type == "cuda":
        ops = cuda_ops()
        sms = ops.properties(ops.index_of(device)).multi_processor_count
        want = max(1, (4 * sms) // max(base_programs, 1))
        return max(1, min(want, p // 1024, 128))
    # Interpreter: split in two whenever there is enough work, so the split path is exercised.
    return 2 if p >= 64 else 1


def _grad_weight(x: Tensor, gy: Tensor, geo: _Geometry, w_shape: Sequence[int]) -> Tensor:
    """gw = conv's grad-weight for input `x` and grad-output `gy` (fp32 partials, then summed)."""
    k = kernels()
    n, _, d, h, wd = x.shape
    cout, cgi, kd, kh, kw = w_shape
    cgo = cout // geo.groups
    od, oh, ow = gy.shape[2:]
    p = n * od * oh * ow
    kk = kd * kh * kw
    base = triton_cdiv(cgo, 64) * triton_cdiv(cgi, 64) * kk * geo.groups
    split = _split_count(p, base, x.device)
    split = max(1, min(split, _MAX_GRID_YZ // geo.groups))
    part = _empty((split, cout, cgi, kk), x, False, torch.float32)

    def grid(meta: dict[str, int]) -> tuple[int, int, int]:
        tiles = triton_cdiv(cgo, meta["BLOCK_M"]) * triton_cdiv(cgi, meta["BLOCK_N"])
        return (tiles, kk, geo.groups * split)

    with device_guard(x.device):  # Triton launches on the current device
        k.conv_wgrad_kernel[grid](
            x, gy, part,
            p, d, h, wd, od, oh, ow, kd, kh, kw, *geo.args, cgi, cgo, geo.groups, split,
            *x.stride(), *gy.stride(),
            **_flags(x.dtype),
        )  # fmt: skip
    return part.sum(0).view(tuple(w_shape)).to(x.dtype)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _grad_bias(gy: Tensor) -> Tensor:
    return gy.sum(dim=(0, 2, 3, 4), dtype=torch.float32).to(gy.dtype)


# ---- autograd functions -------------------------------------------------------------------------


class _ConvFn(torch.autograd.Function):
    """conv(x, w), or with `transposed` conv_transpose(x, w): that is the grad-input of
    conv(., w), so the kernels swap roles."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        w: Tensor,
        b: Tensor | None,
        geo: _Geometry,
        out_spatial: tuple[int, int, int],
        transposed: bool,
    ) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.geo = geo
        ctx.has_bias = b is not None
        ctx.transposed = transposed
        if transposed:
            return _grad_input(x, w, b, geo, out_spatial, like=x)
        return _forward(x, w, b, geo, out_spatial)

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:
        x, w = ctx.saved_tensors
        geo: _Geometry = ctx.geo
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            if ctx.transposed:
                # Only the first x-sized window of gy: output_padding adds rows no input reached.
                gx = _forward(gy, w, None, geo, x.shape[2:])
            else:
                gx = _grad_input(gy, w, None, geo, x.shape[2:], like=x)
        if ctx.needs_input_grad[1]:
            # The plain conv's input and grad-output: gy and x for a transposed conv.
            conv_in, conv_gy = (gy, x) if ctx.transposed else (x, gy)
            gw = _grad_weight(conv_in, conv_gy, geo, w.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = _grad_bias(gy)
        return gx, gw, gb, None, None, None


# ---- public functions ---------------------------------------------------------------------------


def _prepare(
    x: Tensor, weight: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None, bool]:
    ndim = weight.dim() - 2
    unbatched = x.dim() == ndim + 1
    if unbatched:
        x = x.unsqueeze(0)
    x, weight, bias = cast_for_autocast(x, weight, bias)  # type: ignore[assignment]
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"input {x.dtype} and weight {weight.dtype} (and bias) must match")
    if x.dtype not in _DTYPES:
        raise TypeError(f"triton conv supports {_DTYPES}, not {x.dtype}")
    return x, weight, bias, unbatched


def triton_conv(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """Same result as F.conv{1,2,3}d, computed (forward and backward) by Triton kernels."""
    ndim = weight.dim() - 2
    x, weight, bias, unbatched = _prepare(x, weight, bias)
    stride, dilation = ntuple(stride, ndim), ntuple(dilation, ndim)
    kernel = tuple(weight.shape[2:])
    pads = resolve_padding(padding, kernel, dilation, stride)
    out = tuple(
        conv_out_size(n, k, s, d, p)
        for n, k, s, d, p in zip(x.shape[2:], kernel, stride, dilation, pads)
    )
    if any(o <= 0 for o in out):
        raise ValueError(f"output size {out} is too small for input {tuple(x.shape)}")
    geo = _Geometry.make(stride, [p[0] for p in pads], dilation, groups)
    out5 = (1,) * (3 - ndim) + out
    y = _ConvFn.apply(_to5d(x), _to5d(weight), bias, geo, out5, False)
    y = _from5d(y, ndim)
    return y.squeeze(0) if unbatched else y


def triton_conv_transpose(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    output_padding: int | Sequence[int] = 0,
    groups: int = 1,
    dilation: int | Sequence[int] = 1,
) -> Tensor:
    """Same result as F.conv_transpose{1,2,3}d, computed by Triton kernels."""
    ndim = weight.dim() - 2
    x, weight, bias, unbatched = _prepare(x, weight, bias)
    stride, padding = ntuple(stride, ndim), ntuple(padding, ndim)
    output_padding, dilation = ntuple(output_padding, ndim), ntuple(dilation, ndim)
    out = tuple(map(conv_transpose_out_size, x.shape[2:], weight.shape[2:], stride, padding,
                    output_padding, dilation))
    geo = _Geometry.make(stride, padding, dilation, groups)
    out5 = (1,) * (3 - ndim) + out
    y = _ConvFn.apply(_to5d(x), _to5d(weight), bias, geo, out5, True)
    y = _from5d(y, ndim)
    return y.squeeze(0) if unbatched else y


# ---- the registered implementation --------------------------------------------------------------


class TritonImpl(SwappingImpl):
    name = "triton"
    description = "Triton implicit-GEMM kernels (forward, grad input, grad weight)"
    class_prefix = "Triton"
    follows_recipes = True
    autotunes = True
    conv_fn = triton_conv
    conv_transpose_fn = triton_conv_transpose

    def call_why_not(
        self, module: nn.Module, input: Tensor, output_padding: list[int] | None
    ) -> str | None:
        # why_not's rules for this call's tensors: the module may have been swapped without
        # asking, or for another device or dtype. All cheap (the loading checks are cached).
        problem = device_problem(input.device)
        if problem is not None:
            return problem
        cast = autocast_dtype(input.device.type)
        # The dtypes the kernels see (autocast spares float64); the weight's is not computed.
        for own in (input.dtype, weight_dtype(module)):
            dtype = cast if cast is not None and own != torch.float64 else own
            if dtype not in _DTYPES:
                return f"dtype {dtype} is not supported (float32, float16, bfloat16 are)"
        return super().call_why_not(module, input, output_padding)

    def layer_reason(self, sig: ConvSignature) -> str | None:
        if sig.groups > _MAX_GRID_YZ:
            return f"groups={sig.groups} exceeds the grid limit {_MAX_GRID_YZ}"
        return None

    def why_not(
        self, sig: ConvSignature, *, device: torch.device, dtype: torch.dtype
    ) -> str | None:
        problem = device_problem(torch.device(device))
        if problem is not None:
            return problem
        if dtype not in _DTYPES:
            return f"dtype {dtype} is not supported (float32, float16, bfloat16 are)"
        # Correct on any groups (the kernels run them), but not worth a compile and autotune.
        thin = too_thin(sig.in_channels, sig.out_channels, sig.groups)
        return thin or self.layer_reason(sig)
