"""Per-layer implementation choice for models, and applying per-layer configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import advisor
from advisor.apply import AdvisorWarning
from advisor.config import Config, save_config
from advisor.device.environment import current_environment
from advisor.knobs import Settings
from advisor.stages.layer_groups import layer_groups
from advisor.stages.per_layer import layers_map
from advisor.workload.build import model_workload
from tests._cli import python_code
from tests.conftest import DATA, run_env

CPU = torch.device("cpu")
TWIN = str(DATA / "twin_conv3d.py")
SPACE = str(DATA / "per_layer_cpu.yaml")


def test_layers_with_same_signature_share_a_group() -> None:
    groups = layer_groups(model_workload(TWIN), Settings(), CPU)
    names = sorted(g.names for g in groups)
    assert names == [("0", "2"), ("3",)]
    assert all(g.workload.is_layer for g in groups)


def test_layer_groups_record_what_each_layer_receives(tmp_path: Path) -> None:
    """The first conv takes the data (no input gradient in training); under bf16 autocast and
    channels_last the next one receives bf16 activations in channels_last, and is timed so."""
    path = tmp_path / "net.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),"
        " nn.Conv2d(8, 8, 3, padding=1))\n"
        "def example_inputs():\n    return (torch.randn(2, 8, 16, 16),)\n"
    )
    wl = model_workload(str(path))
    train = {g.names: g.workload for g in layer_groups(wl, Settings(), CPU, "train")}
    assert set(train) == {("0",), ("2",)}  # same signature, but only layer 2 needs dgrad
    assert train[("0",)].input_grad == (False,) and train[("2",)].input_grad == (True,)
    infer = layer_groups(wl, Settings(), CPU, "infer")
    assert [g.names for g in infer] == [("0", "2")]  # no gradients: one group
    settings = Settings(amp="bf16", memory_format="channels_last")
    amp = {g.names: g.workload for g in layer_groups(wl, settings, CPU, "train")}
    second = amp[("2",)]
    assert second.example_inputs[0].dtype == torch.bfloat16  # the previous conv's output
    assert second.input_layout == "channels_last"
    assert amp[("0",)].example_inputs[0].dtype == torch.float32  # the data itself


def test_model_gets_per_layer_measurements(tmp_path: Path) -> None:
    advice = advisor.advise(model_file=TWIN, mode="train", device="cpu", space=SPACE)
    df = advice.layer_trials
    shared = df[df["layers"] == "0,2"]
    # the (1,3,3) group: native, unfold_gemm and fold_time all measured and checked
    assert set(shared[shared["status"] == "ok"]["impl"]) == {"native", "unfold_gemm", "fold_time"}
    assert (shared[shared["status"] == "ok"]["rel_error"] < 1e-4).all()
    temporal = df[df["layers"] == "3"]
    assert temporal.set_index("impl").loc["fold_time", "status"] == "not applicable"
    # one choice per group; the config's per-layer map matches those choices
    chosen = df[df["chosen"]]
    assert sorted(chosen["layers"]) == ["0,2", "3"]
    expected = {
        n: impl
        for ls, impl in zip(chosen["layers"], chosen["impl"], strict=True)
        for n in ls.split(",")
        if impl != "native"
    }
    if advice.settings.layers:
        assert advice.settings.layers == expected
        assert advice.trials["layers"].str.len().gt(0).any()  # the combination was measured
    advice.save(tmp_path / "tuned.json")
    assert (tmp_path / "tuned.layers.csv").is_file()


APPLY = r"""
import json, sys, warnings
import torch
import advisor
sys.path.insert(0, sys.argv[2])
from twin_conv3d import build_model, example_inputs
torch.manual_seed(1)
x = torch.randn(1, 4, 4, 12, 12)
ref_model = build_model()
ref = ref_model(x)
ref.square().sum().backward()
model = build_model()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    tuned = advisor.apply(sys.argv[1], model)
(xt,) = tuned.inputs(x)
out = tuned.model(xt)
out.square().sum().backward()
err = ((out - ref).norm() / ref.norm()).item()
gerr = max(((p.grad - q.grad).norm() / q.grad.norm()).item()
           for p, q in zip(model.parameters(), ref_model.parameters()))
print(json.dumps({"err": err, "gerr": gerr, "layers": tuned.layer_impls,
                  "classes": [type(m).__name__ for m in model],
                  "warnings": [str(x.message) for x in w]}))
"""


def _apply_in_fresh_process(path: Path, extra_env: dict[str, str] | None = None) -> dict:
    env = {**run_env(), **(extra_env or {})}
    r = python_code(APPLY, str(path), str(DATA), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _hand_edited(tmp_path: Path, layers: dict[str, str]) -> Path:
    cfg = Config(
        advisor_version=advisor.__version__,
        mode="train",
        settings=Settings(layers=layers),
        environment=current_environment("cpu"),
        workload={"kind": "model"},
        space="per_layer_cpu",
    )
    return save_config(cfg, tmp_path / "edited.json")


def test_hand_edited_config_is_applied_exactly(tmp_path: Path) -> None:
    path = _hand_edited(tmp_path, {"0": "unfold_gemm", "2": "fold_time", "3": "unfold_gemm"})
    got = _apply_in_fresh_process(path)
    assert got["layers"] == {"0": "unfold_gemm", "2": "fold_time", "3": "unfold_gemm"}
    assert got["classes"][0] != "Conv3d"  # swapped module class, still a Conv3d subclass
    assert got["err"] < 1e-5 and got["gerr"] < 1e-4
    assert got["warnings"] == []


def test_triton_layer_without_gpu_or_interpreter_falls_back_with_warning(tmp_path: Path) -> None:
    path = _hand_edited(tmp_path, {"0": "triton"})
    got = _apply_in_fresh_process(path, {"TRITON_INTERPRET": "0"})
    assert got["layers"]["0"] == "native"
    assert any("'0'" in w and "triton" in w for w in got["warnings"])


def test_unknown_layer_names_warn(tmp_path: Path) -> None:
    path = _hand_edited(tmp_path, {"no.such.layer": "unfold_gemm"})
    model = torch.nn.Conv2d(1, 1, 1)
    with pytest.warns(AdvisorWarning, match="no.such.layer"):
        advisor.apply(path, model).restore()


def test_layers_map_only_lists_non_default_choices() -> None:
    groups = layer_groups(model_workload(TWIN), Settings(), CPU)
    from advisor.stages.per_layer import LayerChoice

    choices = [
        LayerChoice(g, {}, "fold_time" if len(g.names) == 2 else "native", "", {}) for g in groups
    ]
    assert layers_map(choices) == {"0": "fold_time", "2": "fold_time"}


def test_resumed_per_layer_stage_measures_nothing_again(tmp_path: Path) -> None:
    import optuna

    from advisor.search.storage import open_storage

    url = f"sqlite:///{tmp_path / 's.db'}"
    kw = dict(model_file=TWIN, mode="train", device="cpu", space=SPACE, storage=url,
              study_name="pl")  # fmt: skip
    first = advisor.advise(**kw)
    storage = open_storage(url)
    name = f"{first.config.workload['study']}/layers"

    def layer_trials() -> list[int]:
        # per-layer measurements only: the whole-model combination depends on the (re-timed) pick
        study = optuna.load_study(study_name=name, storage=storage)
        return [t.number for t in study.trials if "key" in t.user_attrs]

    before = layer_trials()
    assert len(before) == 5  # group (0,2): native, unfold_gemm, fold_time; group 3: two
    advisor.advise(**kw)
    assert layer_trials() == before  # nothing re-measured
    advisor.advise(**kw, fresh=True)  # --fresh starts the per-layer stage over too
    assert len(layer_trials()) == 5


def test_layer_measurements_are_reused_only_under_the_same_global_settings(tmp_path: Path) -> None:
    import optuna

    from advisor.search.options import SearchOptions
    from advisor.search.run import make_evaluator
    from advisor.search.storage import open_storage
    from advisor.space import load_space
    from advisor.stages.per_layer import choose_layer_impls

    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url)
    space = load_space(SPACE, CPU)
    workload = model_workload(TWIN)
    options = SearchOptions(mode="train", storage=url, study_name="x")

    def run(settings: Settings) -> list[advisor.Settings]:
        choices = choose_layer_impls(
            workload, settings, CPU, "train", space,
            lambda wl: make_evaluator(wl, CPU, space, options), storage, "x",
        )  # fmt: skip
        return [r.settings for c in choices for r in c.results.values()]

    def stored() -> int:
        return len(optuna.load_study(study_name="x/layers", storage=storage).trials)

    first = run(Settings())
    assert stored() == 5 and all(s.memory_format == "contiguous" for s in first)
    cl = Settings(memory_format="channels_last")
    second = run(cl)  # other global settings: layers measured again, under those
    # (on this CPU a Conv3d returns contiguous output even from channels_last_3d input, so the
    # twins receive different layouts there and are measured apart)
    total = 5 + len(second)
    assert stored() == total and all(s.memory_format == "channels_last" for s in second)
    assert run(Settings()) == first and run(cl) == second and stored() == total  # both reused


def test_layer_measurements_are_reused_by_another_study_in_the_same_storage(
    tmp_path: Path,
) -> None:
    """A layer group measured under the same settings, mode, rules and machine by any earlier
    study in the storage is not measured again, and the output says so."""
    import optuna

    from advisor.search.storage import open_storage

    url = f"sqlite:///{tmp_path / 's.db'}"
    kw = dict(model_file=TWIN, mode="train", device="cpu", space=SPACE, storage=url)
    first = advisor.advise(**kw, study_name="first")
    second = advisor.advise(**kw, study_name="second")
    storage = open_storage(url)

    def measured(name: str) -> int:
        study = optuna.load_study(study_name=f"{name}/layers", storage=storage)
        return sum(1 for t in study.trials if "key" in t.user_attrs)

    assert measured(first.config.workload["study"]) == 5
    notes = second.config.result.notes
    assert any("5 layer measurement(s) reused" in n and "5 from other studies" in n for n in notes)
    # the second study records them too (its report shows them), without measuring again
    assert measured(second.config.workload["study"]) == 5
    assert {c.chosen for c in second.layer_choices} == {c.chosen for c in first.layer_choices}
    # other rules (another space digest) measure again
    strict = tmp_path / "other.yaml"
    strict.write_text(Path(SPACE).read_text() + "min_gain: 0.05\n")
    third = advisor.advise(**{**kw, "space": str(strict)}, study_name="third")
    assert not any("reused" in n for n in third.config.result.notes)
