"""Published models, each built from its library's own code with a small config and no
downloaded weights (random initialisation), as `build_<name>()` and `inputs_<name>()` pairs:
`advisor advise benchmarks/models/published.py --build build_hubert --inputs inputs_hubert`.
Sizes are small on purpose: a 2-core CPU advises each in minutes. The registry's `published`
set (benchmarks/registry.py) names them with their library and what makes each worth a row.
The libraries are imported inside the factories, so a missing one fails that model's row alone.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# ---- transformers -------------------------------------------------------------------------------

_AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
              num_conv_pos_embeddings=32, num_conv_pos_embedding_groups=4)  # fmt: skip


def build_wav2vec2() -> nn.Module:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    return Wav2Vec2Model(Wav2Vec2Config(**_AUDIO))


def inputs_wav2vec2() -> tuple[Tensor, ...]:
    return (torch.randn(2, 8000),)  # 0.5 s of 16 kHz audio


def build_hubert() -> nn.Module:
    from transformers import HubertConfig, HubertModel

    return HubertModel(HubertConfig(**_AUDIO, feat_extract_norm="group"))


inputs_hubert = inputs_wav2vec2


def build_encodec() -> nn.Module:
    from transformers import EncodecConfig, EncodecModel

    config = EncodecConfig(hidden_size=32, num_filters=8, num_residual_layers=1,
                           upsampling_ratios=[4, 2], codebook_size=64, codebook_dim=32,
                           target_bandwidths=[12.0], sampling_rate=8000)  # fmt: skip
    return EncodecModel(config)


def inputs_encodec() -> tuple[Tensor, ...]:
    return (torch.randn(2, 1, 4000),)


def build_hifigan() -> nn.Module:
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    config = SpeechT5HifiGanConfig(model_in_dim=32, upsample_initial_channel=64,
                                   upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
                                   resblock_kernel_sizes=[3, 7], normalize_before=False,
                                   resblock_dilation_sizes=[[1, 3], [1, 3]])  # fmt: skip
    model = SpeechT5HifiGan(config)
    model.apply_weight_norm()  # as it is trained (its own method: parametrizations.weight_norm)
    return model


def inputs_hifigan() -> tuple[Tensor, ...]:
    return (torch.randn(2, 50, 32),)  # (batch, frames, mel bins)


def build_convnext() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextModel

    return ConvNextModel(ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1]))


def inputs_images() -> tuple[Tensor, ...]:
    return (torch.randn(2, 3, 64, 64),)


inputs_convnext = inputs_resnet = inputs_mobilenet_v2 = inputs_efficientnet = inputs_images
inputs_segformer = inputs_images


def build_resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetModel

    return ResNetModel(ResNetConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                    embedding_size=16))  # fmt: skip


def build_mobilenet_v2() -> nn.Module:
    from transformers import MobileNetV2Config, MobileNetV2Model

    return MobileNetV2Model(MobileNetV2Config(depth_multiplier=0.35, image_size=64))


def build_efficientnet() -> nn.Module:
    from transformers import EfficientNetConfig, EfficientNetModel

    return EfficientNetModel(EfficientNetConfig(width_coefficient=0.25, depth_coefficient=0.25,
                                                image_size=64, hidden_dim=320))  # fmt: skip


def build_segformer() -> nn.Module:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                             num_attention_heads=[1, 2, 2, 4], decoder_hidden_size=64,
                             num_labels=4)  # fmt: skip
    return SegformerForSemanticSegmentation(config)


# ---- MONAI --------------------------------------------------------------------------------------


def build_segresnet() -> nn.Module:
    from monai.networks.nets import SegResNet

    return SegResNet(spatial_dims=3, init_filters=8, in_channels=1, out_channels=2,
                     blocks_down=(1, 2, 2), blocks_up=(1, 1))  # fmt: skip


def inputs_segresnet() -> tuple[Tensor, ...]:
    return (torch.randn(1, 1, 32, 32, 32),)


def build_basic_unet() -> nn.Module:
    from monai.networks.nets import BasicUNet

    return BasicUNet(spatial_dims=2, in_channels=1, out_channels=2,
                     features=(8, 8, 16, 32, 64, 8))  # fmt: skip


def inputs_gray() -> tuple[Tensor, ...]:
    return (torch.randn(2, 1, 64, 64),)


inputs_basic_unet = inputs_dynunet = inputs_attention_unet = inputs_var_autoencoder = inputs_gray


def build_dynunet() -> nn.Module:
    from monai.networks.nets import DynUNet

    return DynUNet(spatial_dims=2, in_channels=1, out_channels=2, kernel_size=[3, 3, 3, 3],
                   strides=[1, 2, 2, 2], upsample_kernel_size=[2, 2, 2],
                   filters=[8, 16, 32, 64])  # fmt: skip


def build_attention_unet() -> nn.Module:
    from monai.networks.nets import AttentionUnet

    return AttentionUnet(spatial_dims=2, in_channels=1, out_channels=2,
                         channels=(8, 16, 32, 64), strides=(2, 2, 2))  # fmt: skip


def build_var_autoencoder() -> nn.Module:
    from monai.networks.nets import VarAutoEncoder

    return VarAutoEncoder(spatial_dims=2, in_shape=(1, 64, 64), out_channels=1, latent_size=16,
                          channels=(8, 16, 32), strides=(2, 2, 2))  # fmt: skip


# ---- timm and torchvision (where they import) ---------------------------------------------------


def build_timm_nf_resnet() -> nn.Module:
    import timm

    return timm.create_model("nf_resnet26", pretrained=False, num_classes=10)


inputs_timm_nf_resnet = inputs_images


def build_tv_googlenet() -> nn.Module:
    from torchvision.models import googlenet

    return googlenet(weights=None, aux_logits=True, init_weights=True, num_classes=10)


def inputs_tv_googlenet() -> tuple[Tensor, ...]:
    return (torch.randn(2, 3, 96, 96),)
