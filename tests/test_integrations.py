"""advisor.integrations without a framework: the precedence rule, input layouts, and imports."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from advisor.apply import AdvisorWarning
from advisor.integrations.layout import ChannelsLastInputs, to_channels_last_in_place
from advisor.integrations.precedence import WarnOnce, apply_over_user
from advisor.knobs import GlobalFlags, Settings
from tests.conftest import cpu_config, run_env

CL = torch.channels_last


@pytest.fixture(autouse=True)
def _flags_back() -> Iterator[None]:
    flags = GlobalFlags.read()
    yield
    GlobalFlags.write(flags)


def _apply(settings: Settings, model: nn.Module | None = None) -> tuple[nn.Module, list[str]]:
    model = model or nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_over_user(
            cpu_config(settings), model, device="cpu", amp="off", user={}, warn=WarnOnce()
        )
    return model, [str(w.message) for w in caught if w.category is AdvisorWarning]


def test_tf32_the_user_set_wins_over_the_config_with_one_warning_naming_both() -> None:
    GlobalFlags.write(GlobalFlags.wanted(Settings(tf32="on")))  # the user's TF32, before training
    user_state = GlobalFlags.read()
    _, said = _apply(Settings(tf32="off"))
    assert GlobalFlags.read() == user_state
    assert len(said) == 1
    assert "tf32='off'" in said[0] and "'on'" in said[0] and "torch.backends" in said[0]


def test_a_config_at_the_default_changes_no_flag_the_user_set() -> None:
    GlobalFlags.write(GlobalFlags.wanted(Settings(tf32="on", cudnn_benchmark=True)))
    user_state = GlobalFlags.read()
    _, said = _apply(Settings(memory_format="channels_last"))  # plain apply would reset both
    assert GlobalFlags.read() == user_state and said == []


def test_a_flag_the_user_left_at_the_default_takes_the_configs_value() -> None:
    _, said = _apply(Settings(cudnn_benchmark=True, tf32="off"))
    flags = GlobalFlags.read()
    assert flags["cudnn_benchmark"] is True
    # TF32 is a CUDA knob: on a CPU its flags stay as they were (PyTorch's defaults here).
    assert flags["tf32"] == {"conv": True, "matmul": False}
    assert said == []


def test_a_model_the_user_made_channels_last_stays_so_under_a_default_config() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)).to(memory_format=CL)
    model, said = _apply(Settings(), model)
    assert all(m.weight.is_contiguous(memory_format=CL) for m in model)
    assert not model[0].weight.is_contiguous() and said == []


def test_batches_are_made_channels_last_in_place_at_any_depth() -> None:
    x, clip, y = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 2, 4, 4), torch.arange(2)
    values = (x.clone(), clip.clone())
    batch = {"images": [x, (clip,)], "labels": y}
    to_channels_last_in_place(batch)
    assert batch["images"][0] is x and x.is_contiguous(memory_format=CL)
    assert clip.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(x, values[0]) and torch.equal(clip, values[1])  # values unchanged
    assert y.is_contiguous()


def test_the_input_hook_converts_positional_and_keyword_tensors() -> None:
    seen: dict[str, bool] = {}

    class Two(nn.Module):
        def forward(self, a: torch.Tensor, *, b: torch.Tensor, scale: float) -> torch.Tensor:
            seen.update(a=a.is_contiguous(memory_format=CL), b=b.is_contiguous(memory_format=CL))
            return a * scale + b

    model = Two()
    model.register_forward_pre_hook(ChannelsLastInputs(), with_kwargs=True)
    x = torch.randn(2, 3, 4, 4)
    out = model(x, b=x, scale=2.0)
    assert seen == {"a": True, "b": True} and torch.allclose(out, 3 * x)


IMPORTS = """
import json, sys
import advisor, advisor.integrations, advisor.integrations.precedence, advisor.integrations.layout
frameworks = ("lightning", "pytorch_lightning", "transformers", "accelerate")
loaded = sorted(m for m in frameworks if m in sys.modules)
missing = {}
for module, framework in (("lightning", "lightning"), ("hf", "transformers")):
    sys.modules[framework] = None  # as if not installed
    try:
        __import__(f"advisor.integrations.{module}")
    except ImportError as e:
        missing[module] = str(e)
print(json.dumps({"loaded": loaded, "missing": missing}))
"""


def test_import_advisor_imports_no_training_framework_and_a_missing_one_names_its_extra() -> None:
    r = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, env=run_env(), timeout=120
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["loaded"] == []
    assert "pip install 'conv-advisor[lightning]'" in got["missing"]["lightning"]
    assert "pip install 'conv-advisor[hf]'" in got["missing"]["hf"]
