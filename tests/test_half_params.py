"""A layer whose parameters are fp16 already: fp16 autocast means nothing there, and fp16
training's GradScaler cannot unscale fp16 gradients (gpu_audit #15)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from advisor.apply import apply_settings
from advisor.knobs import Settings
from advisor.space import SearchSpace, candidates


def test_autocast_to_the_parameters_own_dtype_is_not_a_candidate() -> None:
    space = SearchSpace.model_validate({"name": "s", "knobs": {"amp": ["off", "fp16", "bf16"]}})
    cpu = torch.device("cpu")
    cands, dropped = candidates(space, cpu, param_dtype=torch.float16)
    assert {c.amp for c in cands} == {"off", "bf16"}
    (why,) = [d.reason for d in dropped if d.what == "amp=fp16"]
    assert "fp16 already" in why
    cands, _ = candidates(space, cpu, param_dtype=torch.bfloat16)
    assert {c.amp for c in cands} == {"off", "fp16"}
    cands, _ = candidates(space, cpu)  # fp32 parameters: every value
    assert {c.amp for c in cands} == {"off", "fp16", "bf16"}


def test_an_fp16_model_under_fp16_autocast_trains_without_a_scaler() -> None:
    model = nn.Conv2d(4, 4, 3).half()
    tuned = apply_settings(Settings(amp="fp16"), model, "cpu", training=True)
    try:
        assert tuned.scaler is None
        with tuned.autocast():
            loss = tuned.model(torch.randn(1, 4, 8, 8, dtype=torch.float16)).float().mean()
        loss.backward()
        assert model.weight.grad is not None and model.weight.grad.dtype == torch.float16
    finally:
        tuned.restore()
    fp32 = apply_settings(Settings(amp="fp16"), nn.Conv2d(4, 4, 3), "cpu", training=True)
    assert fp32.scaler is not None  # fp32 weights: the scaler is what fp16 training needs
    fp32.restore()


@pytest.mark.slow
def test_advise_on_an_fp16_layer_with_fp16_in_the_space_fails_no_trial(tmp_path: Path) -> None:
    import advisor

    space = tmp_path / "s.yaml"
    space.write_text(
        "name: s\ndevice: cpu\nknobs: {amp: ['off', fp16]}\nper_layer: false\nrace: false\n"
        "timing: {warmup_runs: 1, warmup_s: 0, min_samples: 3, max_samples: 3, max_time_s: 0.2}\n"
    )
    advice = advisor.advise(layer="Conv2d(4, 4, 3)", input_shape="2,4,8,8", dtype="float16",
                            mode="train", device="cpu", space=str(space), storage="memory")  # fmt: skip
    assert set(advice.trials["status"]) == {"ok"}  # was: amp=fp16 failed in unscale_
    assert set(advice.trials["label"]) == {"default"}
    (dropped,) = [d for d in advice.outcome.dropped if d.what == "amp=fp16"]
    assert "fp16 already" in dropped.reason
