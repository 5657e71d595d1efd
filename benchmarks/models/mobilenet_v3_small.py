"""torchvision's MobileNetV3-Small, written in plain torch (torchvision's wheel does not load here).

Same layers and init as `torchvision.models.mobilenet_v3_small(num_classes=10)` (width_mult=1.0,
reduced_tail=False, dilated=False, dropout=0.2): a 3x3/2 stem with Hardswish, eleven inverted
residual blocks (1x1 expand, depthwise kxk, optional squeeze-excitation with Hardsigmoid gate,
1x1 project; ReLU or Hardswish), a 1x1 conv to 576 channels, adaptive average pool, and the
classifier Linear(576, 1024) - Hardswish - Dropout(0.2) - Linear(1024, 10). BatchNorm eps=1e-3,
momentum=0.01. Init: convs kaiming_normal_(mode="fan_out"), zero bias; BN weight 1 bias 0;
Linear normal(0, 0.01), zero bias.

The classifier's Dropout is random in train mode: code that compares two runs must seed the
global RNG identically before each forward (the mask is then the same for fp32, float64 and
bf16 outputs on this CPU torch) or set `dropout=0.0`.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

NUM_CLASSES = 10


def _make_divisible(v: float, divisor: int, min_value: int | None = None) -> int:
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:  # do not round down by more than 10%
        new_v += divisor
    return new_v


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.misc.Conv2dNormActivation: conv (no bias when normed), norm, activation."""

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size=3,
        stride=1,
        groups=1,
        norm_layer=nn.BatchNorm2d,
        activation_layer=nn.ReLU,
        dilation=1,
    ):
        padding = (kernel_size - 1) // 2 * dilation
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                stride,
                padding,
                dilation=dilation,
                groups=groups,
                bias=norm_layer is None,
            )
        ]
        if norm_layer is not None:
            layers.append(norm_layer(out_channels))
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)
        self.out_channels = out_channels


class SqueezeExcitation(nn.Module):
    """torchvision.ops.misc.SqueezeExcitation with ReLU and a Hardsigmoid gate."""

    def __init__(self, input_channels: int, squeeze_channels: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, input: Tensor) -> Tensor:
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        scale = self.scale_activation(scale)
        return scale * input


class InvertedResidualConfig:
    def __init__(
        self,
        input_channels,
        kernel,
        expanded_channels,
        out_channels,
        use_se,
        activation,
        stride,
        dilation,
        width_mult=1.0,
    ):
        self.input_channels = _make_divisible(input_channels * width_mult, 8)
        self.kernel = kernel
        self.expanded_channels = _make_divisible(expanded_channels * width_mult, 8)
        self.out_channels = _make_divisible(out_channels * width_mult, 8)
        self.use_se = use_se
        self.use_hs = activation == "HS"
        self.stride = stride
        self.dilation = dilation


class InvertedResidual(nn.Module):
    def __init__(self, cnf: InvertedResidualConfig, norm_layer):
        super().__init__()
        self.use_res_connect = cnf.stride == 1 and cnf.input_channels == cnf.out_channels
        layers: list[nn.Module] = []
        activation_layer = nn.Hardswish if cnf.use_hs else nn.ReLU
        if cnf.expanded_channels != cnf.input_channels:  # expand
            layers.append(
                Conv2dNormActivation(
                    cnf.input_channels,
                    cnf.expanded_channels,
                    kernel_size=1,
                    norm_layer=norm_layer,
                    activation_layer=activation_layer,
                )
            )
        stride = 1 if cnf.dilation > 1 else cnf.stride  # depthwise
        layers.append(
            Conv2dNormActivation(
                cnf.expanded_channels,
                cnf.expanded_channels,
                kernel_size=cnf.kernel,
                stride=stride,
                dilation=cnf.dilation,
                groups=cnf.expanded_channels,
                norm_layer=norm_layer,
                activation_layer=activation_layer,
            )
        )
        if cnf.use_se:
            layers.append(
                SqueezeExcitation(
                    cnf.expanded_channels, _make_divisible(cnf.expanded_channels // 4, 8)
                )
            )
        layers.append(
            Conv2dNormActivation(
                cnf.expanded_channels,
                cnf.out_channels,
                kernel_size=1,
                norm_layer=norm_layer,
                activation_layer=None,
            )
        )  # project
        self.block = nn.Sequential(*layers)
        self.out_channels = cnf.out_channels

    def forward(self, input: Tensor) -> Tensor:
        result = self.block(input)
        if self.use_res_connect:
            result += input
        return result


def _small_setting() -> tuple[list[InvertedResidualConfig], int]:
    c = InvertedResidualConfig
    setting = [
        c(16, 3, 16, 16, True, "RE", 2, 1),  # C1
        c(16, 3, 72, 24, False, "RE", 2, 1),  # C2
        c(24, 3, 88, 24, False, "RE", 1, 1),
        c(24, 5, 96, 40, True, "HS", 2, 1),  # C3
        c(40, 5, 240, 40, True, "HS", 1, 1),
        c(40, 5, 240, 40, True, "HS", 1, 1),
        c(40, 5, 120, 48, True, "HS", 1, 1),
        c(48, 5, 144, 48, True, "HS", 1, 1),
        c(48, 5, 288, 96, True, "HS", 2, 1),  # C4
        c(96, 5, 576, 96, True, "HS", 1, 1),
        c(96, 5, 576, 96, True, "HS", 1, 1),
    ]
    return setting, _make_divisible(1024, 8)  # last_channel


class MobileNetV3(nn.Module):
    def __init__(
        self,
        setting: list[InvertedResidualConfig],
        last_channel: int,
        num_classes: int = 1000,
        dropout: float = 0.2,
    ):
        super().__init__()
        norm_layer = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        layers: list[nn.Module] = []
        first_out = setting[0].input_channels
        layers.append(
            Conv2dNormActivation(
                3,
                first_out,
                kernel_size=3,
                stride=2,
                norm_layer=norm_layer,
                activation_layer=nn.Hardswish,
            )
        )
        for cnf in setting:
            layers.append(InvertedResidual(cnf, norm_layer))
        last_in = setting[-1].out_channels
        last_out = 6 * last_in
        layers.append(
            Conv2dNormActivation(
                last_in,
                last_out,
                kernel_size=1,
                norm_layer=norm_layer,
                activation_layer=nn.Hardswish,
            )
        )
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(last_out, last_channel),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=dropout, inplace=True),
            nn.Linear(last_channel, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


def build_model(dropout: float = 0.2) -> nn.Module:
    setting, last_channel = _small_setting()
    return MobileNetV3(setting, last_channel, num_classes=NUM_CLASSES, dropout=dropout)


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(4, 3, 64, 64),)
