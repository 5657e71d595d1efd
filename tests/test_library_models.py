"""Models built from library convs, advised end to end (issue 42).

- A stage that fails on one layer names it in one line, keeps PyTorch's forward for it, and the
  run goes on to a recommendation.
- Issue 42's two models advise with exit code 0 from the CLI: Wav2Vec2 from a small config (its
  positional conv weight-normed, its output a ModelOutput) and timm's StdConv2d + Conv2dSame +
  a weight-normed nn.Conv2d. Every layer is then swapped wherever an implementation may take it,
  and the model checked against the untouched one in float64, forward and backward.
- QAT's ConvBn2d and ConvReLU2d, a user's subclass, a Lazy conv and the hook-based norms in one
  model: the classes that override forward are kept native with the reason in the per-layer
  table; the others are measured.

The CLI runs use the short test space (tests/data/per_layer_cpu.yaml): a few seconds each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from torch import nn

import advisor
from advisor import impls
from advisor.apply import apply_settings
from advisor.impls._swap import SwappingImpl
from advisor.impls.base import ConvSignature
from advisor.knobs import Settings
from advisor.measure.candidate import flatten_tensors
from tests._cli import advisor_cli
from tests.conftest import DATA

CPU = torch.device("cpu")
SPACE = DATA / "per_layer_cpu.yaml"


class PickyImpl(SwappingImpl):
    """Computes like native, but its own check raises on layers of 7 output channels."""

    name = "test_picky"
    description = "test only: its check fails on one layer"
    class_prefix = "TestPicky"

    def layer_reason(self, sig: ConvSignature) -> str | None:
        if sig.out_channels == 7:
            raise RuntimeError("test_picky cannot judge a layer of 7 channels")
        return None

    def module_forward(self, module, input, padding, output_padding):  # noqa: ANN001, ANN201
        return module._conv_forward(input, module.weight, module.bias)


@pytest.fixture
def picky() -> Iterator[None]:
    impls.register(PickyImpl())
    yield
    impls._REGISTRY.pop(PickyImpl.name, None)


def test_a_stage_failing_on_one_layer_keeps_it_native_and_goes_on(
    picky: None, tmp_path: Path
) -> None:
    model = tmp_path / "net.py"
    model.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Conv2d(3, 7, 3), nn.ReLU(), nn.Conv2d(7, 8, 3))\n"
        "def example_inputs():\n    return (torch.randn(2, 3, 12, 12),)\n"
    )
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.read_text().replace("[native, unfold_gemm, fold_time]",
                                               "[native, test_picky]"))  # fmt: skip
    advice = advisor.advise(model_file=str(model), mode="train", device="cpu", space=str(space))
    rows = advice.layer_trials.set_index(["layers", "impl"])
    kept = rows.loc[("0", "native")]
    assert kept["status"] == "kept" and kept["chosen"]
    assert "checking it failed: RuntimeError: test_picky cannot judge" in kept["reason"]
    assert rows.loc[("2", "test_picky"), "status"] == "ok"  # the other layer was measured
    assert advice.settings.layers.get("0", "native") == "native"
    assert advice.config.result is not None
    notes = [n for n in advice.config.result.notes if n.startswith("layer 0 ")]
    assert len(notes) == 1 and "keeps PyTorch's forward: checking it failed" in notes[0]


def _advise_cli(model_file: Path, tmp_path: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    out = tmp_path / "tuned.json"
    r = advisor_cli("advise", str(model_file), "--mode", "train", "--device", "cpu",
                    "--space", str(SPACE), "--storage", "memory", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    return json.loads(out.read_text()), pd.read_csv(tmp_path / "tuned.layers.csv", dtype={"layers": str})


def _check_swapped_everywhere(build: Callable[[], nn.Module], x: torch.Tensor) -> dict[str, str]:
    """Every layer an implementation may take computed by unfold_gemm, in float64: outputs and
    gradients as the untouched model's. Returns what each conv layer ran with."""
    torch.manual_seed(0)
    untouched = build().double().eval()  # eval: no dropout, no masking; gradients all the same
    torch.manual_seed(0)
    model = build().double().eval()
    model.load_state_dict(untouched.state_dict())
    results = []
    tuned = apply_settings(Settings(conv_impl="unfold_gemm"), model, CPU, warn=False)
    try:
        for m in (untouched, tuned.model):
            xd = x.double().requires_grad_(True)
            outs = flatten_tensors(m(xd))
            sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
            results.append([*outs, xd.grad, *(p.grad for p in m.parameters())])
    finally:
        tuned.restore()
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    return tuned.layer_impls


@pytest.mark.slow  # the CLI as a user runs it: its processes start torch (6 s; 25 s when busy)
def test_timm_and_weight_normed_convs_advise_and_compute_as_their_classes(tmp_path: Path) -> None:
    from tests.data import timm_convs

    try:
        timm_convs.timm_layers()
    except ImportError as e:
        pytest.skip(f"timm: {e}")
    _, layers = _advise_cli(DATA / "timm_convs.py", tmp_path)
    measured = layers[layers["status"] == "ok"]
    # StdConv2d and Conv2dSame by their recipes, the weight-normed conv as it is: all measured
    assert set(measured["layers"]) == {"0", "2", "4"}
    assert set(measured["impl"]) == {"native", "unfold_gemm"}
    used = _check_swapped_everywhere(timm_convs.build_model, torch.randn(2, 3, 17, 17))
    assert used == {"0": "unfold_gemm", "2": "unfold_gemm", "4": "unfold_gemm"}


@pytest.mark.slow  # transformers loads in 2-5 s; the model takes 10 s more on a busy machine
def test_wav2vec2_advises_and_its_weight_normed_conv_computes_as_built() -> None:
    """Through the API, in this process (the CLI's path is the test above's)."""
    pytest.importorskip("transformers")
    from tests.data import wav2vec2_tiny

    advice = advisor.advise(model_file=str(DATA / "wav2vec2_tiny.py"), mode="train",
                            device="cpu", space=str(SPACE))  # fmt: skip
    layers = advice.layer_trials
    pos = layers[layers["layers"] == "encoder.pos_conv_embed.conv"].set_index("impl")
    assert pos.loc["native", "status"] == "ok" and pos.loc["unfold_gemm", "status"] == "ok"
    used = _check_swapped_everywhere(wav2vec2_tiny.build_model, torch.randn(2, 1600))
    assert used["encoder.pos_conv_embed.conv"] == "unfold_gemm"
    assert set(used.values()) == {"unfold_gemm"}


def test_classes_that_override_forward_are_kept_with_the_reason(tmp_path: Path) -> None:
    advice = advisor.advise(model_file=str(DATA / "subclass_convs.py"), mode="train",
                            device="cpu", space=str(SPACE))  # fmt: skip
    df = advice.layer_trials
    kept = df[df["status"] == "kept"].set_index("layers")
    assert sorted(kept.index) == ["0", "1", "3"]  # ConvBn2d, ConvReLU2d, the user's ScaledConv
    for layer, cls in (("0", "ConvBn2d"), ("1", "ConvReLU2d"), ("3", "ScaledConv")):
        assert f"{cls} overrides forward" in kept.loc[layer, "reason"]
        assert not (df[df["layers"] == layer]["impl"] != "native").any() or (
            df[(df["layers"] == layer) & (df["impl"] != "native")]["status"] == "not applicable"
        ).all()
    # the Lazy conv and the hook-normed convs share one measured group
    assert set(df[df["status"] == "ok"]["layers"]) == {"2,4,5"}
    assert not {"0", "1", "3"} & set(advice.settings.layers)
    used = _check_swapped_everywhere(_built_once(), torch.randn(2, 3, 12, 12))
    assert [used[str(i)] for i in range(6)] == ["native"] * 2 + ["unfold_gemm", "native"] + [
        "unfold_gemm"
    ] * 2


def _built_once() -> Callable[[], nn.Module]:
    """subclass_convs' model with its Lazy conv initialised (so both copies share its weights)
    and its QAT observers off (their float64 state is not what is checked here)."""
    from torch.ao.quantization import disable_fake_quant, disable_observer

    from tests.data import subclass_convs

    def build() -> nn.Module:
        model = subclass_convs.build_model()
        model(torch.randn(1, 3, 12, 12))
        model.apply(disable_observer).apply(disable_fake_quant)
        return model

    return build
