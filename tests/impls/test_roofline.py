"""Roofline arithmetic (exact) and a peak measurement that stays cheap on CPU."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from advisor.impls.base import ConvSignature
from advisor.measure import roofline


def _sig(module: nn.Module) -> ConvSignature:
    return ConvSignature.from_module(module)


def test_conv_flops_matches_the_formula() -> None:
    sig = _sig(nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2))
    # out 2x16x5x5; 2*N*Cout*prod(out)*(Cin/g)*prod(k)
    assert roofline.conv_flops(sig, (2, 8, 10, 10), backward=False) == 2 * 2 * 16 * 25 * 4 * 9
    assert roofline.conv_flops(sig, (2, 8, 10, 10), backward=True) == 3 * 2 * 2 * 16 * 25 * 4 * 9


def test_same_padding_and_conv3d() -> None:
    sig = _sig(nn.Conv3d(2, 2, (1, 3, 3), padding="same"))
    assert roofline.output_shape(sig, (1, 2, 4, 8, 8)) == (1, 2, 4, 8, 8)
    assert roofline.conv_flops(sig, (1, 2, 4, 8, 8), False) == 2 * 2 * 256 * 2 * 9


def test_transposed_flops_equal_the_mirrored_conv() -> None:
    conv = _sig(nn.Conv2d(4, 8, 3, stride=2, padding=1))
    convt = _sig(nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1))
    assert roofline.output_shape(convt, (1, 8, 5, 5)) == (1, 4, 10, 10)
    assert roofline.conv_flops(convt, (1, 8, 5, 5), False) == roofline.conv_flops(
        conv, (1, 4, 10, 10), False
    )


def test_min_bytes() -> None:
    sig = _sig(nn.Conv2d(3, 4, 1, bias=True))
    elems = 2 * 3 * 5 * 5 + 4 * 3 + 4 + 2 * 4 * 5 * 5
    assert roofline.conv_min_bytes(sig, (2, 3, 5, 5), torch.float32) == 4 * elems
    assert roofline.conv_min_bytes(sig, (2, 3, 5, 5), torch.bfloat16, backward=True) == 4 * elems


def test_fraction_is_floor_over_time() -> None:
    peaks = roofline.Peaks(flops_per_s=1e9, bytes_per_s=1e8)
    assert roofline.roofline_fraction(1.0, 1e9, 1e7, peaks) == pytest.approx(1.0)
    assert roofline.roofline_fraction(2.0, 1e8, 1e8, peaks) == pytest.approx(0.5)


def test_measure_peaks_on_cpu_is_quick_and_positive() -> None:
    t0 = time.process_time()
    peaks = roofline.measure_peaks("cpu")
    # Its cost in CPU seconds (all threads), which other load does not stretch as it does wall
    # time: about 0.5 s on 2 threads, alone or beside three busy loops (1 s and 3 s wall).
    assert time.process_time() - t0 < 4  # "well under 2 s" on 2 threads
    assert peaks.flops_per_s > 1e8 and peaks.bytes_per_s > 1e8


SPEC = {"kind": "Conv2d", "in_channels": 2, "out_channels": 2, "kernel_size": 1,
        "input_shape": [1, 2, 64, 64], "dtype": "float32"}  # fmt: skip


def test_a_layer_is_judged_at_the_precision_it_was_measured_in() -> None:
    sig, shape = _sig(nn.Conv2d(2, 2, 1)), (1, 2, 64, 64)
    flops = roofline.conv_flops(sig, shape, backward=True)
    for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16),
                             ("tf32", torch.float32), ("fp32", torch.float32)):  # fmt: skip
        nbytes = roofline.conv_min_bytes(sig, shape, dtype, backward=True)
        assert roofline.layer_cost(SPEC, "train", precision) == (flops, nbytes)
    # this CPU's measured peaks, one measurement per precision (cached: the same numbers here)
    bf16, fp32 = roofline.cached_peaks("cpu", "bf16"), roofline.cached_peaks("cpu", "fp32")
    assert bf16 != fp32
    got = roofline.layer_fraction(SPEC, "train", 2.0, "cpu", "bf16")
    bf16_bytes = roofline.conv_min_bytes(sig, shape, torch.bfloat16, backward=True)
    assert got == roofline.roofline_fraction(2e-3, flops, bf16_bytes, bf16)
    # TF32 exists on GPUs only; a float64 layer in the fp32 class is judged at float64's peak
    assert roofline.peak_problem("tf32", "cpu") == "tf32 n/a on cpu"
    assert roofline.peak_problem("tf32", "cuda") is None
    with pytest.raises(ValueError, match="tf32 n/a on cpu"):
        roofline.precision_peaks("cpu", "tf32")
    assert roofline.layer_precision("tf32", torch.float64) == "fp64"
    assert roofline.layer_precision("bf16", torch.float32) == "bf16"


def test_peaks_are_measured_under_their_precisions_flags() -> None:
    """The fp32 peak's matmuls run with TF32 off (IEEE) whatever the flags were, and the flags
    are put back after."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from advisor.knobs import GlobalFlags, Settings

    class MatmulFlags(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[bool] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out):
                self.seen.add(GlobalFlags.matmul_tf32())
            return func(*args, **(kwargs or {}))

    with GlobalFlags() as flags:
        flags.apply(Settings(tf32="on"))
        mode = MatmulFlags()
        with mode:
            roofline.precision_peaks("cpu", "fp32")
        assert mode.seen == {False}
        assert GlobalFlags.matmul_tf32()  # restored
