import pytest
import torch

from advisor.device import environment, flags
from advisor.errors import SpaceError
from advisor.knobs import Settings
from advisor.space import SearchSpace, builtin_space_names, candidates, load_space

CPU = torch.device("cpu")


def test_builtin_spaces_load() -> None:
    assert {"cpu", "cuda", "strict_fp32"} <= set(builtin_space_names())
    assert load_space(None, CPU).name == "cpu"
    assert load_space("strict_fp32", CPU).tolerances.fp32 == 1e-4
    with pytest.raises(SpaceError, match="is for cuda"):
        load_space("cuda", CPU)


@pytest.mark.parametrize(
    "units,kernels", [(False, False), (False, True), (True, True)],
    ids=["AVX2", "AVX-512 without bf16 units", "bf16 units"],
)  # fmt: skip
def test_cpu_candidates_drop_cuda_knobs_with_reasons(
    units: bool, kernels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same answer on every development machine: what this CPU has is set here
    monkeypatch.setattr(environment, "cpu_has_bf16_units", lambda: units)
    monkeypatch.setattr(environment, "cpu_bf16_kernels", lambda device: kernels)
    space = load_space("cpu", CPU)
    cands, dropped = candidates(space, CPU, impls=["native"])
    assert cands[0] == Settings()  # PyTorch's default first
    offers_bf16_fp32 = units and flags.has_mkldnn_conv_precision()
    # 2 layouts x 2 amp (bf16 autocast only where PyTorch has oneDNN bf16 kernels: the space's
    # skip rule, with its why), and 2 layouts with cpu_fp32=bf16 where oneDNN can compute fp32
    # convs with bf16 units (not under bf16 autocast: every conv is bf16 there already)
    assert len(cands) == (6 if offers_bf16_fp32 else 4 if kernels else 2)
    assert any(c.amp == "bf16" for c in cands) == kernels
    assert ("amp=bf16" in {d.what for d in dropped}) != kernels
    assert {c.cpu_fp32 for c in cands} == ({"ieee", "bf16"} if offers_bf16_fp32 else {"ieee"})
    assert not any(c.cpu_fp32 == "bf16" and c.amp != "off" for c in cands)
    assert all(c.tf32 == "conv" and not c.cudnn_benchmark for c in cands)
    reasons = {d.what: d.reason for d in dropped}
    assert {c.conv_impl for c in cands} == {"native"}  # the plan says why (a layer's)
    assert ("cpu_fp32" in reasons) != offers_bf16_fp32
    assert ("cpu_fp32=bf16 with amp" in reasons) == offers_bf16_fp32


def test_skip_rules_remove_combinations() -> None:
    space = SearchSpace(
        name="t",
        knobs={"memory_format": ["contiguous", "channels_last"], "amp": ["off", "bf16"]},
        skip=[{"amp": "bf16", "memory_format": "contiguous"}],
    )
    cands, _ = candidates(space, CPU)
    labels = [c.label() for c in cands]
    assert labels == [
        "default",
        "memory_format=channels_last",
        "memory_format=channels_last, amp=bf16",
    ]
    # the default is never skipped, even when a rule matches it
    space = SearchSpace(name="t", knobs={"amp": ["off", "bf16"]}, skip=[{"amp": "off"}])
    assert candidates(space, CPU)[0][0] == Settings()


def test_skip_rules_test_the_cpus_bf16_kernels_and_say_why() -> None:
    """A rule naming `cpu_bf16_kernels` applies only where the CPU's answer matches; its `why`
    lists what it left out (one entry per rule); a rule without one leaves silently."""
    here = environment.cpu_bf16_kernels(CPU)
    assert environment.cpu_bf16_kernels(torch.device("meta")) is None  # not a CPU
    with pytest.MonkeyPatch.context() as m:  # the stand-in for an AVX2 CPU (docs/development.md)
        m.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
        assert environment.cpu_bf16_kernels(CPU) is False
    for value in (here, not here):
        space = SearchSpace(
            name="t",
            knobs={"memory_format": ["contiguous", "channels_last"], "amp": ["off", "bf16"]},
            skip=[{"amp": "bf16", "cpu_bf16_kernels": value, "why": "slow here"},
                  {"memory_format": "channels_last", "amp": "off"}],
        )  # fmt: skip
        cands, dropped = candidates(space, CPU)
        bf16 = [c.label() for c in cands if c.amp == "bf16"]
        assert bf16 == ([] if value == here else ["amp=bf16", "memory_format=channels_last, amp=bf16"])
        assert [(d.what, d.reason) for d in dropped if d.reason == "slow here"] == (
            [("amp=bf16", "slow here")] if value == here else []
        )
        assert "memory_format=channels_last" not in [c.label() for c in cands]
        assert not any("channels_last" in d.what and d.what != "amp=bf16" for d in dropped)


def test_yaml_booleans_read_as_on_off(tmp_path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nknobs:\n  tf32: [off, on]\n  amp: [off]\n")
    space = load_space(f, CPU)
    assert space.knobs["tf32"] == ["off", "on"]
    assert space.knobs["amp"] == ["off"]


@pytest.mark.parametrize(
    "text,needle",
    [
        ("name: s\nknobs:\n  warp_speed: [1]\n", "unknown knob"),
        ("name: s\nknobs:\n  amp: [fp8]\n", "knobs"),
        ("name: s\nknobs: {}\nbudget: {trials: 0}\n", "budget.trials"),
        ("name: s\nknobs: {}\nsurprise: 1\n", "surprise"),
        ("name: [unclosed\n", "cannot parse"),
        ("- a\n- b\n", "mapping"),
    ],
)
def test_bad_space_files(tmp_path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SpaceError) as e:
        load_space(f, CPU)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unknown_space_name() -> None:
    with pytest.raises(SpaceError, match="unknown search space"):
        load_space("warp", CPU)


def test_yaml_booleans_in_skip_rules_read_as_on_off(tmp_path) -> None:
    """A bare `off` in a skip rule is YAML's False: read back as "off", it matches amp="off"."""
    f = tmp_path / "s.yaml"
    f.write_text(
        "name: s\nknobs:\n  memory_format: [contiguous, channels_last]\n  amp: [off, bf16]\n"
        "skip:\n  - {amp: off, memory_format: channels_last}\n"
    )
    space = load_space(f, CPU)
    assert space.skip == [{"amp": "off", "memory_format": "channels_last"}]
    labels = [c.label() for c in candidates(space, CPU)[0]]
    assert "memory_format=channels_last" not in labels  # skipped, as the rule says
    assert "memory_format=channels_last, amp=bf16" in labels


def test_skip_rule_values_take_the_knobs_own_form() -> None:
    space = SearchSpace(
        name="t",
        knobs={"memory_format": ["contiguous", "channels_last"]},
        skip=[{"memory_format": "channels_last_3d", "device": "cpu"}],
    )
    assert space.skip == [{"memory_format": "channels_last", "device": "cpu"}]
    assert [c.label() for c in candidates(space, CPU)[0]] == ["default"]


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"knobs": {}, "skip": [{"amp": "fp8"}]}, "skip rule value 'fp8' is not valid for amp"),
        ({"knobs": {}, "skip": [{"tf32": "sometimes"}]}, "not valid for tf32"),
        ({"knobs": {}, "skip": [{"device": "tpu"}]}, "device 'tpu'"),
        ({"knobs": {}, "skip": [{"cpu_bf16_kernels": "no"}]}, "cpu_bf16_kernels: 'no' is not a bool"),
        ({"knobs": {}, "skip": [{"amp": "bf16", "why": 3}]}, "why: 3 is not a str"),
        ({"knobs": {}, "skip": [{"conv_impl": "warp_speed"}]}, "unknown conv implementation"),
        ({"knobs": {"conv_impl": ["native", "warp_speed"]}}, "'warp_speed'; known: native"),
        (
            {"knobs": {}, "timing": {"min_samples": 9, "max_samples": 8}},
            "min_samples (9) is more than max_samples (8)",
        ),
    ],
)
def test_quiet_wrongs_in_a_space_are_errors(kwargs, needle: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        SearchSpace(name="t", **kwargs)
    assert needle in str(info.value)


def test_unknown_conv_impl_in_a_space_file_is_a_space_error(tmp_path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nknobs:\n  conv_impl: [native, warp_speed]\n")
    with pytest.raises(SpaceError, match=r"unknown conv implementation 'warp_speed'; known: "):
        load_space(f, CPU)


def test_a_layer_is_told_which_implementations_cannot_run_it_and_a_model_is_not() -> None:
    # A model's implementations are chosen per layer after the global search: none is left out
    # of its plan. A layer's plan says which of the space's implementations cannot run it.
    from advisor.search.options import SearchOptions
    from advisor.search.study import open_plan
    from advisor.workload.args import make_workload
    from tests.conftest import DATA

    cpu = torch.device("cpu")
    space = load_space("cpu", cpu)
    options = SearchOptions(mode="infer", storage="memory")
    conv = make_workload(layer="Conv2d(4, 4, 3)", input_shape="1,4,8,8")
    layer = open_plan(conv, cpu, space, options)
    unfit = {d.what for d in layer.dropped if d.what.startswith("conv_impl=")}
    assert "conv_impl=fold_time" in unfit and "conv_impl=native" not in unfit
    assert {f"conv_impl={s.conv_impl}" for s in layer.cands}.isdisjoint(unfit)
    model = open_plan(make_workload(model_file=str(DATA / "tiny_cnn.py")), cpu, space, options)
    assert not [d for d in model.dropped if d.what.startswith("conv_impl=")]
