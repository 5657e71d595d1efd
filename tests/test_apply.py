"""advisor.apply at training start, in a fresh process as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import advisor
from advisor.apply import AdvisorWarning
from advisor.config import Config, save_config
from advisor.environment import current_environment
from advisor.knobs import GlobalFlags, Settings
from tests.conftest import run_env

APPLY_SCRIPT = r"""
import json, sys
import torch
import advisor
from advisor.examples.small_cnn import build_model, example_inputs
model = build_model()
tuned = advisor.apply(sys.argv[1], model)
(x,) = tuned.inputs(*example_inputs())
with tuned.autocast():
    y = tuned.model(x)
print(json.dumps({
    "flags": advisor.knobs.GlobalFlags.read(),
    "channels_last": model[0].weight.is_contiguous(memory_format=torch.channels_last),
    "out_dtype": str(y.dtype),
    "optuna": "optuna" in sys.modules,
    "pandas": "pandas" in sys.modules,
    "layers": tuned.layer_impls,
}))
"""


def _config(tmp_path: Path, settings: Settings, env=None) -> Path:
    cfg = Config(
        advisor_version=advisor.__version__,
        mode="train",
        settings=settings,
        environment=env or current_environment("cpu"),
        workload={"kind": "model", "description": "small_cnn"},
        space="cpu",
    )
    return save_config(cfg, tmp_path / "tuned.json")


def test_apply_in_fresh_process_sets_exactly_the_recorded_settings(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        Settings(memory_format="channels_last", amp="bf16", cudnn_benchmark=True, tf32="on"),
    )
    r = subprocess.run(
        [sys.executable, "-c", APPLY_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["channels_last"] is True
    assert got["out_dtype"] == "torch.bfloat16"
    assert got["flags"]["cudnn_benchmark"] is True
    assert got["flags"]["tf32"]["conv"] in ("tf32", True)
    assert got["flags"]["tf32"]["matmul"] in ("tf32", True)
    assert got["optuna"] is False and got["pandas"] is False  # training start stays light
    assert set(got["layers"].values()) == {"native"}


def test_tuned_model_matches_untuned_within_tolerance(
    tmp_path: Path, fast_space: str, small_model_file: str
) -> None:
    advice = advisor.advise(
        model_file=small_model_file, mode="train", device="cpu", space=fast_space
    )
    path = advice.save(tmp_path / "tuned.json")
    from tests.data import tiny_cnn

    x = torch.randn(2, 3, 16, 16)
    ref = tiny_cnn.build_model()(x)
    model = tiny_cnn.build_model()
    with advisor.apply(path, model) as tuned:
        (xt,) = tuned.inputs(x)
        with tuned.autocast():
            out = tuned.model(xt)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err <= advice.config.result.tolerance


def test_apply_warns_on_foreign_environment(tmp_path: Path) -> None:
    foreign = current_environment("cpu").model_copy(
        update={"device_name": "Some Other CPU", "fingerprint": "0000000000000000"}
    )
    path = _config(tmp_path, Settings(), env=foreign)
    with pytest.warns(AdvisorWarning, match="another environment.*device_name"):
        advisor.apply(path, torch.nn.Conv2d(1, 1, 1)).restore()


def test_apply_restore_puts_flags_back(tmp_path: Path) -> None:
    before = GlobalFlags.read()
    path = _config(tmp_path, Settings(cudnn_benchmark=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same environment: no warning
        tuned = advisor.apply(path, torch.nn.Conv2d(1, 1, 1))
    assert torch.backends.cudnn.benchmark is True
    tuned.restore()
    assert GlobalFlags.read() == before
