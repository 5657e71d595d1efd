import pytest
import torch

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


def test_cpu_candidates_drop_cuda_knobs_with_reasons() -> None:
    space = load_space("cpu", CPU)
    cands, dropped = candidates(space, CPU, impls=["native"])
    assert cands[0] == Settings()  # PyTorch's default first
    assert len(cands) == 4  # 2 layouts x 2 amp
    assert all(c.tf32 == "conv" and not c.cudnn_benchmark for c in cands)
    reasons = {d.what: d.reason for d in dropped}
    assert "conv_impl=unfold_gemm" in reasons


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
