"""Roofline floor of a conv layer: the least time its FLOPs and its bytes could take on a device.

FLOPs = 2·N·C_out·∏out_spatial·(C_in/groups)·∏kernel for a forward (a transposed conv counts as
the plain conv it is the gradient of); forward + backward = 3x forward. Fewest bytes = every
tensor moved once. Peaks are measured here (a large matmul, a large copy), not taken from a data
sheet, so the fraction says how close a layer came to what this machine really does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from statistics import median
from typing import Any

import torch

from advisor.device.ops import cuda_ops
from advisor.impls._swap import conv_transpose_out_size
from advisor.impls.base import ConvSignature


@dataclass(frozen=True)
class Peaks:
    flops_per_s: float
    bytes_per_s: float


def output_shape(sig: ConvSignature, input_shape: Sequence[int]) -> tuple[int, ...]:
    """N, C_out, *spatial of the layer's output for a batched input shape."""
    n, _, *size = input_shape
    out = []
    for i, (s_in, k, s, d) in enumerate(zip(size, sig.kernel_size, sig.stride, sig.dilation)):
        if sig.transposed:
            op = sig.output_padding[i]
            out.append(conv_transpose_out_size(s_in, k, s, int(sig.padding[i]), op, d))
        elif sig.padding == "same":
            out.append(s_in)
        else:
            p = 0 if sig.padding == "valid" else int(sig.padding[i])
            out.append((s_in + 2 * p - d * (k - 1) - 1) // s + 1)
    return (n, sig.out_channels, *out)


def conv_flops(sig: ConvSignature, input_shape: Sequence[int], backward: bool) -> int:
    """FLOPs of the layer's forward, or forward + backward (3x) when `backward`."""
    out_shape = output_shape(sig, input_shape)
    if sig.transposed:
        # The plain conv it mirrors has the transposed conv's input as its output.
        n, c_out, spatial = input_shape[0], sig.in_channels, input_shape[2:]
        c_in = sig.out_channels
    else:
        n, c_out, spatial = out_shape[0], sig.out_channels, out_shape[2:]
        c_in = sig.in_channels
    forward = 2 * n * c_out * prod(spatial) * (c_in // sig.groups) * prod(sig.kernel_size)
    return 3 * forward if backward else forward


def conv_min_bytes(
    sig: ConvSignature, input_shape: Sequence[int], dtype: torch.dtype, backward: bool = False
) -> int:
    """Bytes moved if input, weight, bias and output each cross memory once (and, with
    `backward`, also the output grad read and the input, weight and bias grads written)."""
    item = torch.empty((), dtype=dtype).element_size()
    weight = sig.out_channels * (sig.in_channels // sig.groups) * prod(sig.kernel_size)
    bias = sig.out_channels if sig.bias else 0
    elems = prod(input_shape) + weight + bias + prod(output_shape(sig, input_shape))
    return item * (2 * elems if backward else elems)


def roofline_fraction(time_s: float, flops: float, bytes: float, peaks: Peaks) -> float:
    """Floor time over measured time: 1.0 means the layer ran at the machine's limit."""
    floor_s = max(flops / peaks.flops_per_s, bytes / peaks.bytes_per_s)
    return floor_s / time_s


def _median_time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    sync = (lambda: cuda_ops().synchronize(device)) if device.type == "cuda" else (lambda: None)
    fn()  # warm-up: lazy init, allocator, library handles
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return median(times)


def _matmul_n(device: torch.device, dtype: torch.dtype) -> int:
    """Matmul size for the peak: 8192 on CUDA, 1024 on CPU, except for 16-bit types on a CPU
    without fast ones (~100x slower than fp32 there), where 256 keeps the measurement quick."""
    if device.type == "cuda":
        return 8192
    if dtype not in (torch.float16, torch.bfloat16):
        return 1024
    a = torch.randn(256, 256, dtype=dtype)
    return 1024 if 64 * _median_time(lambda: torch.mm(a, a), device, 3) < 0.2 else 256


def measure_peaks(device: torch.device | str, dtype: torch.dtype = torch.float32) -> Peaks:
    """Matmul FLOP/s and copy bytes/s measured on `device` (median of a few repeats), under the
    TF32 flags in force (see `precision_peaks` for a precision's own).

    Sizes are chosen per device type: on CPU the whole measurement takes well under 2 s.
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    n = _matmul_n(device, dtype)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    mm_s = _median_time(lambda: torch.mm(a, b, out=out), device, 10 if cuda else 5)
    numel = (1 << 28 if cuda else 1 << 24) // 4  # 256 MiB on CUDA (past L2), 16 MiB on CPU
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    copy_s = _median_time(lambda: dst.copy_(src), device, 10 if cuda else 5)
    return Peaks(flops_per_s=2 * n**3 / mm_s, bytes_per_s=2 * src.nbytes / copy_s)


# The element type each precision computes and moves (a layer's bytes are counted at its size).
PRECISION_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}


def peak_problem(precision: str, device_type: str) -> str | None:
    """Why this machine has no peak for `precision` (e.g. 'tf32 n/a on cpu'), else None."""
    if precision not in PRECISION_DTYPES:
        return f"{precision} n/a"
    if precision == "tf32" and device_type != "cuda":
        return f"tf32 n/a on {device_type}"  # TF32 is a tensor-core format: GPUs only
    return None


def precision_peaks(device: torch.device | str, precision: str) -> Peaks:
    """Peaks at `precision` ('fp32', 'tf32', 'fp16', 'bf16', 'fp64'), measured under its flags
    (through GlobalFlags, restored after): TF32 matmuls for 'tf32' only, so 'fp32' is IEEE."""
    from advisor.knobs import GlobalFlags, Settings

    device = torch.device(device)
    problem = peak_problem(precision, device.type)
    if problem is not None:
        raise ValueError(problem)
    with GlobalFlags() as flags:
        flags.apply(Settings(tf32="on" if precision == "tf32" else "off"))
        return measure_peaks(device, PRECISION_DTYPES[precision])


@functools.cache
def cached_peaks(device: str, precision: str) -> Peaks:
    """`precision_peaks`, measured once per process."""
    return precision_peaks(device, precision)


def layer_precision(precision: str, dtype: torch.dtype) -> str:
    """The precision a layer's roofline is taken at: its trial's (`knobs.precision_of`, which
    puts a float64 layer in the fp32 class: its peak is float64's)."""
    return "fp64" if dtype == torch.float64 and precision in ("fp32", "tf32") else precision


def layer_cost(spec: dict[str, Any], mode: str, precision: str) -> tuple[int, int]:
    """(FLOPs, fewest bytes) of a layer spec (advisor.workload.layer_spec.LayerSpec fields) in `mode`
    ('infer', or 'train' which counts the backward too), bytes at `precision`'s element size."""
    from advisor.workload.layer_spec import LayerSpec

    layer = LayerSpec(**spec)
    sig = ConvSignature.from_module(layer.construct())
    backward = mode == "train"
    flops = conv_flops(sig, layer.input_shape, backward)
    return flops, conv_min_bytes(sig, layer.input_shape, PRECISION_DTYPES[precision], backward)


def layer_fraction(
    spec: dict[str, Any], mode: str, median_ms: float, device: str, precision: str
) -> float:
    """Roofline fraction of a layer spec timed at `median_ms` in `mode` at `precision` (its
    trial's: `layer_precision`) on this machine's `device`: that precision's measured peak, and
    bytes at its element size (`layer_cost`)."""
    flops, nbytes = layer_cost(spec, mode, precision)
    return roofline_fraction(median_ms / 1e3, flops, nbytes, cached_peaks(device, precision))
