"""advisor.apply at training start, in a fresh process as a user would run it."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch

import advisor
from advisor.apply import AdvisorWarning
from advisor.config import Config, save_config
from advisor.device.environment import current_environment
from advisor.knobs import GlobalFlags, Settings
from tests._cli import python_code

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
    r = python_code(APPLY_SCRIPT, str(path), timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["channels_last"] is True
    assert got["out_dtype"] == "torch.bfloat16"
    assert got["flags"]["cudnn_benchmark"] is True
    # TF32 is a CUDA knob: on a CPU its flags stay as they were (PyTorch's defaults here).
    assert got["flags"]["tf32"] == {"conv": True, "matmul": False}
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


def _two_convs() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3))


def test_apply_is_all_or_nothing_with_an_unknown_implementation(tmp_path: Path) -> None:
    """A config naming an implementation that is not installed here: nothing is half-applied;
    that layer falls back to native with a warning naming it, the others are applied."""
    path = _config(tmp_path, Settings(layers={"0": "unfold_gemm", "1": "warp_speed"}))
    model = _two_convs()
    reference = copy.deepcopy(model)
    with pytest.warns(AdvisorWarning, match=r"layer '1': warp_speed cannot run here.*native"):
        tuned = advisor.apply(path, model)
    assert tuned.layer_impls == {"0": "unfold_gemm", "1": "native"}
    assert type(model[0]).__name__ != "Conv2d" and type(model[1]) is torch.nn.Conv2d
    x = torch.randn(1, 3, 8, 8)
    assert torch.allclose(tuned.model(x), reference(x), atol=1e-5)
    tuned.restore()


def test_apply_unknown_global_conv_impl_falls_back_for_every_layer(tmp_path: Path) -> None:
    path = _config(tmp_path, Settings(conv_impl="warp_speed"))
    model = _two_convs()
    with pytest.warns(AdvisorWarning, match="warp_speed") as caught:
        tuned = advisor.apply(path, model)
    named = " ".join(str(w.message) for w in caught)
    assert "layer '0'" in named and "layer '1'" in named
    assert tuned.layer_impls == {"0": "native", "1": "native"}
    tuned.restore()


def test_apply_swaps_nothing_when_a_swap_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """An implementation whose wrap fails after it said it could run: the layers swapped before it
    get their own classes back, and the error is raised."""
    from advisor import impls
    from advisor.apply import apply_settings

    real_swap = impls.swap

    def swap(module: torch.nn.Module, name: str) -> torch.nn.Module:
        if module.in_channels == 4:
            raise RuntimeError("wrap failed")
        return real_swap(module, name)

    monkeypatch.setattr(impls, "swap", swap)
    model = _two_convs()
    with pytest.raises(RuntimeError, match="wrap failed"):
        apply_settings(Settings(conv_impl="unfold_gemm"), model, "cpu")
    assert type(model[0]) is torch.nn.Conv2d and type(model[1]) is torch.nn.Conv2d


def test_the_search_never_measures_an_unknown_implementation_as_native() -> None:
    from advisor.apply import apply_settings
    from advisor.errors import ImplError

    model = _two_convs()
    with pytest.raises(ImplError, match="unknown conv implementation 'warp_speed'"):
        apply_settings(Settings(layers={"0": "unfold_gemm", "1": "warp_speed"}), model, warn=False)
    assert type(model[0]) is torch.nn.Conv2d  # validated before anything changed


def test_apply_warns_when_the_fingerprint_was_edited(tmp_path: Path) -> None:
    edited = current_environment("cpu").model_copy(update={"fingerprint": "0123456789abcdef"})
    with pytest.warns(AdvisorWarning, match="fingerprint.*0123456789abcdef.*edited"):
        advisor.apply(_config(tmp_path, Settings(), env=edited), torch.nn.Conv2d(1, 1, 1)).restore()


def test_apply_compares_fields_not_the_stored_fingerprint(tmp_path: Path) -> None:
    # A field edited with the fingerprint left as it was: the fields decide.
    edited = current_environment("cpu").model_copy(update={"device_name": "Some Other CPU"})
    with pytest.warns(AdvisorWarning, match="device_name"):
        advisor.apply(_config(tmp_path, Settings(), env=edited), torch.nn.Conv2d(1, 1, 1)).restore()


def test_fp16_config_from_cuda_applied_on_cpu_warns(tmp_path: Path) -> None:
    cuda = current_environment("cpu").model_copy(
        update={"device_type": "cuda", "device_name": "Some GPU"}
    )
    path = _config(tmp_path, Settings(amp="fp16"), env=cuda)
    with pytest.warns(AdvisorWarning) as caught:
        advisor.apply(path, torch.nn.Conv2d(1, 1, 1), device="cpu").restore()
    assert any("fp16 autocast" in str(w.message) and "slow" in str(w.message) for w in caught)


def test_fp16_config_tuned_on_this_cpu_applies_silently(tmp_path: Path) -> None:
    path = _config(tmp_path, Settings(amp="fp16"))  # measured here: a space that listed fp16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        advisor.apply(path, torch.nn.Conv2d(1, 1, 1)).restore()
