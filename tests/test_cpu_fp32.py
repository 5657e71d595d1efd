"""oneDNN's bf16 fp32 convs (`cpu_fp32=bf16`, the CPU's TF32): offered only where the CPU has bf16
units, written and restored through the one door for flags, judged like any reduced precision.
These tests pretend either kind of CPU, so they do not depend on which one runs them (oneDNN
ignores the setting on a CPU without bf16 units: it computes in IEEE fp32 there)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import advisor
from advisor.apply import apply_settings
from advisor.device import environment, flags
from advisor.gate.numeric import Gate
from advisor.knobs import Settings, cpu_fp32_why_not, precision_of
from advisor.space import SearchSpace, candidates
from tests.conftest import DATA

CPU = torch.device("cpu")
SPACE = SearchSpace.model_validate({"name": "s", "knobs": {"cpu_fp32": ["ieee", "bf16"]}})


@pytest.fixture(params=[True, False], ids=["bf16 units", "no bf16 units"])
def units(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(environment, "cpu_has_bf16_units", lambda: request.param)
    return request.param


def test_offered_only_where_the_cpu_has_bf16_units(units: bool) -> None:
    cands, dropped = candidates(SPACE, CPU)
    offered = {c.cpu_fp32 for c in cands}
    if units:
        assert offered == {"ieee", "bf16"} and cpu_fp32_why_not(CPU) is None
    else:
        assert offered == {"ieee"}
        (d,) = [d for d in dropped if d.what == "cpu_fp32"]
        assert "no bf16 units" in d.reason
    assert cpu_fp32_why_not(torch.device("cuda")) == "CPU only"


@pytest.mark.parametrize(
    ("cap", "units"),
    [(None, True), ("AVX2", False), ("avx512_core_vnni", False), ("AVX512_CORE_BF16", True),
     ("AVX512_CORE_AMX", True), ("ALL", True), ("SOMETHING_NEWER", True)],
)  # fmt: skip
def test_bf16_units_are_not_counted_where_onednn_is_capped_below_them(
    cap: str | None, units: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CPU with AVX-512 BF16 whose oneDNN is capped below it (ONEDNN_MAX_CPU_ISA) emulates bf16
    # convs: no cpu_fp32=bf16 there, and the capability names the cap, so that a run under it is
    # keyed as another machine's (its stored advice, its benchmark rows).
    monkeypatch.setattr(environment, "_cpuinfo_field",
                        lambda name: "fpu avx2 avx512f avx512_bf16" if name == "flags" else None)  # fmt: skip
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert environment.cpu_has_bf16_units() is units
    assert (cpu_fp32_why_not(CPU) is None) is (units and flags.has_mkldnn_conv_precision())
    named = environment._cpu_capability().split()[-1]
    assert named == (f"onednn<={cap.upper()}" if cap not in (None, "ALL") else "avx512_bf16")


def test_written_through_the_one_door_and_restored(units: bool) -> None:
    conv = torch.backends.mkldnn.conv
    before = conv.fp32_precision
    tuned = apply_settings(Settings(cpu_fp32="bf16"), nn.Conv2d(3, 4, 3), "cpu")
    try:
        assert conv.fp32_precision == ("bf16" if units else before)
        torch.get_float32_matmul_precision()  # the legacy getters still read
        _ = torch.backends.cudnn.allow_tf32
    finally:
        tuned.restore()
    assert conv.fp32_precision == before


def test_judged_as_a_bf16_precision_on_its_own_path() -> None:
    s = Settings(cpu_fp32="bf16", memory_format="channels_last")
    assert precision_of(s, CPU) == "bf16"
    assert Gate.own_path(s) == Settings(cpu_fp32="bf16")  # not bf16 autocast's path
    assert precision_of(Settings(cpu_fp32="bf16", amp="bf16"), CPU) == "bf16"


@pytest.mark.slow
def test_advise_judges_it_by_training_where_it_is_offered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "cpu_has_bf16_units", lambda: True)
    space = tmp_path / "s.yaml"
    space.write_text(
        "name: s\ndevice: cpu\nknobs: {cpu_fp32: [ieee, bf16]}\nper_layer: false\nrace: false\n"
        "precision_check: {steps: 12, batches: 2}\n"
        "timing: {warmup_runs: 1, warmup_s: 0, min_samples: 3, max_samples: 3, max_time_s: 0.1}\n"
    )
    advice = advisor.advise(model_file=str(DATA / "tiny_cnn.py"), mode="train", device="cpu",
                            space=str(space), storage="memory")  # fmt: skip
    row = advice.trials[advice.trials["label"] == "cpu_fp32=bf16"]
    assert list(row["status"]) == ["ok"] and list(row["precision"]) == ["bf16"]
    (line,) = advice.config.result.precisions
    assert line.startswith("bf16 fp32 convs (oneDNN): trains like fp32")
