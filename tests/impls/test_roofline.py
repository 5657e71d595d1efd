"""Roofline arithmetic (exact) and a peak measurement that stays cheap on CPU."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from advisor import roofline
from advisor.impls.base import ConvSignature


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
