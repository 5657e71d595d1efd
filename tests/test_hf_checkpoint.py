"""A channels_last config prepared for the Hugging Face Trainer still saves checkpoints with
safetensors (found by the docs test: the Trainer's save refused the conv weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advisor.knobs import Settings
from tests.conftest import cpu_config

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")


def test_a_channels_last_model_saves_and_loads_with_safetensors(tmp_path: Path) -> None:
    from advisor.examples.small_cnn import build_model
    from advisor.integrations.hf import prepare

    model = build_model()
    prepare(model, cpu_config(Settings(memory_format="channels_last")), device="cpu")
    conv = model[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    path = tmp_path / "model.safetensors"
    safetensors.save_file(model.state_dict(), str(path))  # refused without the hook
    fresh = build_model()
    fresh.load_state_dict(safetensors.load_file(str(path)))
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k
    # the model itself stays in the tuned layout
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
