"""The cases of `benchmarks/suite.py`: the seeds' layers at their original sizes, and real models.

Each case builds its model and example inputs on the CPU (fp32, weights from a fixed seed), at the
full size or, with `quick`, at a tiny size for a CPU smoke run. Single-layer cases also carry their
layer spec so the advisor tunes them as a layer (implementations searched in the global grid);
the others are tuned as models (implementations chosen per layer). torchvision is imported only
when one of its models is built; `Case.missing()` says when it is not installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Mode = Literal["infer", "train"]


@dataclass(frozen=True)
class Case:
    name: str
    mode: Mode
    description: str  # one line for the table: what runs, at full size
    build: Callable[[bool], nn.Module]  # quick -> fresh model (CPU, fp32)
    shapes: Callable[[bool], list[tuple[int, ...]]]  # quick -> input shapes
    layer: Callable[[bool], str] | None = None  # quick -> layer spec text, for single-layer cases
    needs: str | None = None  # a package that must be importable

    def missing(self) -> str | None:
        """Why this case cannot run here (a package is not installed), or None."""
        if self.needs and importlib.util.find_spec(self.needs) is None:
            return f"{self.needs} is not installed"
        return None

    def make_model(self, quick: bool) -> nn.Module:
        torch.manual_seed(0)  # the same weights in every process that builds this case
        return self.build(quick)

    def make_inputs(self, quick: bool, seed: int = 1) -> tuple[torch.Tensor, ...]:
        """Fresh random inputs (never zeros: they hide unwritten outputs), on the CPU."""
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(s, generator=gen) for s in self.shapes(quick))


def _layer_case(
    name: str, mode: Mode, full: tuple[str, tuple[int, ...]], quick: tuple[str, tuple[int, ...]]
) -> Case:
    from advisor.workload.layer_spec import layer_spec

    def pick(q: bool) -> tuple[str, tuple[int, ...]]:
        return quick if q else full

    text, shape = full
    return Case(
        name=name,
        mode=mode,
        description=f"{text} on {'x'.join(map(str, shape))}, {mode}",
        build=lambda q: layer_spec(pick(q)[0], input_shape=list(pick(q)[1])).construct(),
        shapes=lambda q: [pick(q)[1]],
        layer=lambda q: pick(q)[0],
    )


# ----- the seeds' layers -----


def _dw_transpose_bn(channels: int) -> nn.Module:
    # The seed's upsampling block: depthwise 2x2 stride-2 ConvTranspose2d, then BatchNorm.
    return nn.Sequential(
        nn.ConvTranspose2d(channels, channels, 2, stride=2, groups=channels, bias=False),
        nn.BatchNorm2d(channels),
    )


def _dw_case(batch: int) -> Case:
    q_batch = max(1, batch // 8)
    return Case(
        name=f"seed_dwconvT_bn_b{batch}",
        mode="infer",
        description=(
            f"depthwise ConvTranspose2d(2048, 2048, 2, stride=2, groups=2048) + BatchNorm2d "
            f"on {batch}x2048x16x16, infer"
        ),
        build=lambda q: _dw_transpose_bn(32 if q else 2048),
        shapes=lambda q: [(q_batch, 32, 8, 8) if q else (batch, 2048, 16, 16)],
    )


# ----- a UNet decoder -----


class _ConvBlock(nn.Sequential):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )


class UNetDecoder(nn.Module):
    """The upsampling path of a UNet: per stage a 2x2 stride-2 ConvTranspose2d, concatenation
    with the encoder's skip tensor, and two 3x3 conv + BN + ReLU; then a 1x1 classifier.

    Inputs: the bottleneck (N, 2*widths[0], H/16, W/16) and the skips, deepest first:
    (N, widths[i], H/2^(3-i), W/2^(3-i)).
    """

    def __init__(self, widths: tuple[int, ...] = (512, 256, 128, 64), classes: int = 21) -> None:
        super().__init__()
        ups, blocks = [], []
        c = 2 * widths[0]
        for w in widths:
            ups.append(nn.ConvTranspose2d(c, w, 2, stride=2))
            blocks.append(_ConvBlock(2 * w, w))
            c = w
        self.ups = nn.ModuleList(ups)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x: torch.Tensor, *skips: torch.Tensor) -> torch.Tensor:
        for up, block, skip in zip(self.ups, self.blocks, skips, strict=True):
            x = block(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def _unet_shapes(batch: int, size: int, widths: tuple[int, ...]) -> list[tuple[int, ...]]:
    shapes = [(batch, 2 * widths[0], size // 16, size // 16)]
    shapes += [(batch, w, size // 2 ** (3 - i), size // 2 ** (3 - i)) for i, w in enumerate(widths)]
    return shapes


_UNET_FULL = (512, 256, 128, 64)
_UNET_QUICK = (32, 16, 8, 8)


# ----- torchvision models (imported lazily: not every machine has torchvision) -----


def _torchvision_model(name: str) -> nn.Module:
    import torchvision

    return getattr(torchvision.models, name)(weights=None)


def _torchvision_video_model(name: str) -> nn.Module:
    import torchvision.models.video

    return getattr(torchvision.models.video, name)(weights=None)


CASES: list[Case] = [
    _layer_case(
        "seed_conv3d_1x3x3_train",
        "train",
        ("Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False)", (8, 2, 500, 64, 64)),
        ("Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False)", (1, 2, 8, 32, 32)),
    ),
    *(_dw_case(b) for b in (8, 16, 32, 64)),
    _layer_case(
        "seed_conv2d_3to16_infer",
        "infer",
        ("Conv2d(3, 16, 3, padding=1)", (1, 3, 1024, 1024)),
        ("Conv2d(3, 16, 3, padding=1)", (1, 3, 128, 128)),
    ),
    *(
        _layer_case(
            f"seed_conv2d_512to1024_b{b}_infer",
            "infer",
            ("Conv2d(512, 1024, 3)", (b, 512, 128, 256)),
            ("Conv2d(32, 64, 3)", (min(b, 2), 32, 16, 32)),
        )
        for b in (1, 5)
    ),
    Case(
        name="resnet50_train",
        mode="train",
        description="torchvision resnet50 on 32x3x224x224, train",
        build=lambda q: _torchvision_model("resnet50"),
        shapes=lambda q: [(2, 3, 64, 64) if q else (32, 3, 224, 224)],
        needs="torchvision",
    ),
    Case(
        name="mobilenet_v3_large_train",
        mode="train",
        description="torchvision mobilenet_v3_large on 64x3x224x224, train",
        build=lambda q: _torchvision_model("mobilenet_v3_large"),
        shapes=lambda q: [(2, 3, 64, 64) if q else (64, 3, 224, 224)],
        needs="torchvision",
    ),
    Case(
        name="unet_decoder_train",
        mode="train",
        description="UNet decoder (4 stages 1024->64 ch, ConvTranspose2d + 2x conv3x3-BN-ReLU, "
        "skips) to 8x21x256x256, train",
        build=lambda q: UNetDecoder(_UNET_QUICK if q else _UNET_FULL),
        shapes=lambda q: (
            _unet_shapes(1, 64, _UNET_QUICK) if q else _unet_shapes(8, 256, _UNET_FULL)
        ),
    ),
    Case(
        name="r2plus1d_18_train",
        mode="train",
        description="torchvision r2plus1d_18 (Conv3d (1,3,3) + (3,1,1)) on 8x3x16x112x112, train",
        build=lambda q: _torchvision_video_model("r2plus1d_18"),
        shapes=lambda q: [(1, 3, 4, 32, 32) if q else (8, 3, 16, 112, 112)],
        needs="torchvision",
    ),
]

BY_NAME: dict[str, Case] = {c.name: c for c in CASES}
