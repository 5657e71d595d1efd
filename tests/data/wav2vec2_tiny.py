"""Hugging Face's Wav2Vec2 from a small config (no downloaded weights): a 1-D conv feature
extractor, then a transformer whose positional conv is weight-normed
(torch.nn.utils.parametrizations.weight_norm: a ParametrizedConv1d). Its output is a ModelOutput.
Issue 42's first model."""

from __future__ import annotations

import torch
from torch import nn


def build_model() -> nn.Module:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16, 16),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    return Wav2Vec2Model(config)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 1600),)  # 0.1 s of 16 kHz audio
