"""An implementation that autotunes (Triton) is tried on a layer group only where its measured
autotuning could pay back within the advice's horizon (advisor/stages/autotune_bound.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.stages.autotune_bound import AutotuneBound

CPU = torch.device("cpu")


def _layer(impl: str, median_ms: float, first_ms: float) -> TrialResult:
    m = Measurement(samples_ms=[median_ms] * 5, first_call_ms=first_ms)
    return TrialResult(settings=Settings(conv_impl=impl), status="ok", measurement=m,
                       precision="fp32")  # fmt: skip


def test_a_group_is_tried_until_its_autotuning_is_known_then_only_where_it_can_pay() -> None:
    bound = AutotuneBound(Contest(steps=10_000))
    native = _layer("native", 0.05, 2.0)
    assert bound.why_not("triton", native, layers=1) is None  # nothing measured yet: try it
    bound.measured("triton", _layer("triton", 0.04, 3_002.0), native)
    assert bound.cost_ms == pytest.approx(3_000.0)
    # 0.05 ms a step over 10,000 steps is 0.5 s: a 3 s autotuning cannot pay even at zero time
    why = bound.why_not("triton", native, layers=1)
    assert why is not None and "3.0 s" in why and "10,000 steps" in why
    # four layers share the group: 2 s at most, still short; ten: 5 s, it could
    assert bound.why_not("triton", native, layers=4) is not None
    assert bound.why_not("triton", native, layers=10) is None
    assert AutotuneBound(Contest(steps=100_000), bound.cost_ms).why_not("triton", native, layers=1) is None
    # implementations without autotuning are never held back
    assert bound.why_not("unfold_gemm", native, layers=1) is None
    # a cheaper autotuning measured later (kernels cached) lowers the cost
    bound.measured("triton", _layer("triton", 0.04, 1_002.0), native)
    assert bound.cost_ms == pytest.approx(1_000.0)
    bound.measured("unfold_gemm", _layer("unfold_gemm", 0.04, 50_000.0), native)
    assert bound.cost_ms == pytest.approx(1_000.0)


SMALL_LAYERS = (
    "import torch\nfrom torch import nn\n"
    "def build_model():\n"
    "    torch.manual_seed(0)\n"
    "    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),\n"
    "                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))\n"
    "def example_inputs():\n    return (torch.randn(2, 2, 8, 8),)\n"
)


def test_triton_is_stopped_mid_autotuning_where_it_cannot_pay_and_held_where_known_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from advisor.search.options import SearchOptions
    from advisor.search.run import make_evaluator
    from advisor.search.storage import open_storage
    from advisor.space import load_space
    from advisor.stages.per_layer import choose_layer_impls
    from advisor.workload.build import model_workload
    from tests.conftest import DATA

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    net = tmp_path / "small_layers.py"
    net.write_text(SMALL_LAYERS)
    space_file = tmp_path / "triton_cpu.yaml"
    space_file.write_text((DATA / "per_layer_cpu.yaml").read_text().replace(
        "conv_impl: [native, unfold_gemm, fold_time]", "conv_impl: [native, triton]")
        .replace("race: false", "race: true"))  # the allowance is a race's  # fmt: skip
    space = load_space(str(space_file), CPU)

    made: list = []

    def evaluator(wl: object, options: SearchOptions) -> object:
        made.append(make_evaluator(wl, CPU, space, options))  # type: ignore[arg-type]
        return made[-1]

    def choose(name: str, steps: int, bound: AutotuneBound | None = None) -> list:
        url = f"sqlite:///{tmp_path / name}"
        options = SearchOptions(mode="infer", storage=url, study_name="x", isolate=True)
        return choose_layer_impls(model_workload(str(net)), Settings(), CPU, "infer", space,
                                  lambda wl: evaluator(wl, options), open_storage(url), "x",
                                  steps, bound=bound)  # type: ignore[arg-type]  # fmt: skip

    # Over 10 steps a group's native time repays well under a millisecond: each group's
    # autotuning starts (nothing is known yet: a stopped one measures no cost) and is stopped
    # at that allowance, during its first call
    choices = choose("short.db", steps=10)
    assert len(choices) == 3
    for c in choices:
        native, triton = c.results["native"], c.results["triton"]
        stop = triton.stop
        assert triton.status == "stopped" and stop is not None and stop.kind == "cannot_pay"
        assert stop.one_off == "autotuning" and stop.horizon_steps == 10
        assert stop.saving_ms == pytest.approx(native.median_ms * len(c.group.names))
        assert (triton.reason or "").startswith("its autotuning cannot pay back within 10 steps")
        assert c.chosen == "native"
    # one worker served every group: a stopped autotuning leaves no state to discard (a stopped
    # compile does: its worker is replaced)
    assert len(made) == 1 and made[0].starts == 1
    # An autotuning cost known to exceed what any group could repay: none is tried
    known = AutotuneBound(space.contest(10_000), cost_ms=1e9)
    held = choose("held.db", steps=10_000, bound=known)
    assert all("triton" not in c.results and "autotuning" in c.skipped["triton"] for c in held)
    # The stored stops are the 10-step horizon's: reused at 10 steps, not at another horizon
    # (there the cost known above holds Triton back instead of the stored verdict)
    stats: dict[str, int] = {}
    again = choose_layer_impls(model_workload(str(net)), Settings(), CPU, "infer", space,
                               lambda wl: evaluator(wl, SearchOptions(mode="infer")),
                               open_storage(f"sqlite:///{tmp_path / 'short.db'}"), "x", 10,
                               stats=stats)  # fmt: skip
    assert stats["reused"] == 6 and all(c.results["triton"].stop is not None for c in again)
    longer = choose("short.db", steps=1_000_000, bound=AutotuneBound(space.contest(1_000_000),
                                                                     cost_ms=1e12))  # fmt: skip
    assert all("triton" not in c.results and "autotuning" in c.skipped["triton"] for c in longer)
