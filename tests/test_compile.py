"""The compile knob: which modes run where, which candidates are compiled, what a compile costs
and when it pays, `advisor.apply` compiling last, and compiled candidates measured and gated
end to end (a real torch.compile of small models: tens of seconds on a 2-core CPU)."""

from __future__ import annotations

import importlib
import logging
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import advisor
import advisor.compiled
from advisor.compiled import recompile_guard, recompile_reason
from advisor.device.environment import current_environment
from advisor.execute import gating
from advisor.execute.runner import Gate, evaluate
from advisor.gate.numeric import compare
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement, Race
from advisor.search.compile_bill import (
    alternative,
    bill,
    compile_note,
    one_off_s,
    paid_by,
    paying,
)
from advisor.search.options import SearchOutcome
from advisor.search.pick import decide
from advisor.space import SearchSpace, candidates, compile_modes, load_space
from advisor.stages.budget import budget_plan
from advisor.stages.compiling import compile_candidates, compile_race
from advisor.workload.args import make_workload
from tests._cli import python_code

DATA = Path(__file__).parent / "data"
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
ALL_MODES = ["off", "default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"]


def _space(tmp_path: Path, knobs: str, **extra: str) -> str:
    path = tmp_path / "compile.yaml"
    rest = "".join(f"{k}: {v}\n" for k, v in extra.items())
    path.write_text(
        f"name: compile-test\ndevice: cpu\nknobs: {knobs}\n"
        "timing: {warmup_runs: 1, warmup_s: 0, min_samples: 5, max_samples: 15, max_time_s: 0.3}\n"
        "per_layer: false\nrace: false\n" + rest
    )
    return str(path)


def _r(settings: Settings, ms: float, *, first_ms: float = 1.0, cold: float | None = None,
       retimed: bool = True) -> TrialResult:  # fmt: skip
    return TrialResult(
        settings=settings,
        status="ok",
        measurement=Measurement(samples_ms=[ms] * 7, first_call_ms=first_ms),
        compile_cold_s=cold,
        retimed=retimed,
    )


# ---- which modes, which candidates ---------------------------------------------------------------


def test_each_device_gets_the_modes_that_mean_something_there() -> None:
    space = SearchSpace(name="s", knobs={"compile": [False, *ALL_MODES[1:]]})  # YAML's bare off
    assert space.knobs["compile"] == ALL_MODES
    cpu, dropped = compile_modes(space, CPU)
    assert cpu == ["default", "max-autotune"]
    why = {d.what: d.reason for d in dropped}
    assert "CUDA only" in why["compile=reduce-overhead"]
    assert "max-autotune" in why["compile=max-autotune-no-cudagraphs"]
    assert compile_modes(space, CUDA) == (ALL_MODES[1:], [])
    # the built-in spaces, and the eager grid never holds a compiled candidate
    assert compile_modes(load_space("cpu", CPU), CPU)[0] == ["default"]
    assert compile_modes(load_space("cuda", CUDA), CUDA)[0] == [
        "default", "max-autotune-no-cudagraphs", "reduce-overhead"
    ]  # fmt: skip
    grid, _ = candidates(load_space("cpu", CPU), CPU)
    assert grid and not any(s.compiled for s in grid)


def test_compiled_candidates_are_the_best_eager_ones_and_the_default() -> None:
    base, cl = Settings(), Settings(memory_format="channels_last")
    fast = Settings(memory_format="channels_last", amp="bf16", layers={"0": "unfold_gemm"})
    results = [_r(base, 10.0), _r(cl, 9.0), _r(fast, 5.0)]
    outcome = SearchOutcome(results, results[0], [], "s", current_environment(CPU), 0.0)
    space = SearchSpace(name="s", knobs={"compile": ["off", "default", "reduce-overhead"]})
    got = compile_candidates(outcome, space, CPU, False, space.contest())
    # the eager pick (per-layer swaps left out: native convs under compile), then the default:
    # an eager win need not carry into a compiled graph
    assert got == [
        Settings(memory_format="channels_last", amp="bf16", compile="default"),
        Settings(compile="default"),
    ]
    assert [d.what for d in outcome.dropped] == ["compile=reduce-overhead"]
    shape_set = compile_candidates(outcome, space, CPU, True, space.contest())
    assert [s.compile_dynamic for s in shape_set] == [False, True, False, True]
    # where the default is the eager pick, it is what gets compiled
    alone = [_r(base, 10.0), _r(cl, 10.1)]
    outcome = SearchOutcome(alone, alone[0], [], "s", current_environment(CPU), 0.0)
    assert compile_candidates(outcome, space, CPU, False, space.contest()) == [Settings(compile="default")]


def test_on_a_cpu_the_channels_last_twin_is_compiled_in_place_of_the_contiguous_one() -> None:
    """Inductor runs every conv in channels_last on a CPU with oneDNN: a contiguous candidate
    compiles to the same graph plus a weight conversion per step, so its channels_last twin is
    compiled instead, once (MobileNetV3-Small train: the eager pick channels_last and the
    default were both compiled, 57 s cold each)."""
    from advisor.device.flags import onednn_convs
    from advisor.stages.compiling import inductor_convs_channels_last

    assert inductor_convs_channels_last(CPU) == onednn_convs()
    if not inductor_convs_channels_last(CPU):
        pytest.skip("this torch has no oneDNN: Inductor keeps the model's layout")
    assert not inductor_convs_channels_last(torch.device("cuda"))
    base, cl = Settings(), Settings(memory_format="channels_last")
    bf16, cl_bf16 = Settings(amp="bf16"), Settings(memory_format="channels_last", amp="bf16")
    space = SearchSpace(name="s", knobs={"memory_format": ["contiguous", "channels_last"],
                                         "amp": ["off", "bf16"], "compile": ["off", "default"]})  # fmt: skip

    def got(results: list[TrialResult], baseline: int = 0) -> tuple[list[Settings], list[str]]:
        outcome = SearchOutcome(results, results[baseline], [], "s", current_environment(CPU), 0.0)
        return compile_candidates(outcome, space, CPU, False, space.contest()), [
            d.what for d in outcome.dropped
        ]

    # MobileNetV3-Small train: the eager pick is channels_last; the default compiles as its twin
    todo, dropped = got([_r(base, 33.8), _r(cl, 27.6), _r(bf16, 40.0)])
    assert todo == [Settings(memory_format="channels_last", compile="default")]
    assert dropped == ["compile on PyTorch's default settings"]
    # the default the pick, the fastest and the baseline at once (Wav2Vec2 train): one row, once
    todo, dropped = got([_r(base, 21.9), _r(cl, 23.5)])
    assert todo == [Settings(memory_format="channels_last", compile="default")]
    assert dropped == ["compile on PyTorch's default settings"]
    # a contiguous pick (amp=bf16) compiles as channels_last + bf16, and the default as cl
    todo, _ = got([_r(base, 43.0), _r(cl, 45.0), _r(bf16, 35.0), _r(cl_bf16, 50.0)])
    assert todo == [cl_bf16.model_copy(update={"compile": "default"}),
                    cl.model_copy(update={"compile": "default"})]  # fmt: skip
    # where channels_last failed (or its numerics were rejected) the model's layout is compiled
    broken = _r(cl, 27.6).model_copy(update={"status": "failed", "measurement": None})
    todo, dropped = got([_r(base, 33.8), broken])
    assert todo == [Settings(compile="default")] and dropped == []
    # a space without channels_last compiles what it has
    only = SearchSpace(name="s", knobs={"amp": ["off", "bf16"], "compile": ["off", "default"]})
    outcome = SearchOutcome([_r(base, 33.8), _r(bf16, 30.0)], _r(base, 33.8), [], "s",
                            current_environment(CPU), 0.0)  # fmt: skip
    assert all(s.memory_format == "contiguous"
               for s in compile_candidates(outcome, only, CPU, False, only.contest()))  # fmt: skip


def test_the_default_is_not_compiled_where_no_compile_could_rescue_it() -> None:
    # small_cnn train on a 2-core CPU: the default at 40.2 ms, the eager pick (channels_last +
    # bf16) at 19.8 ms. Its compile (7 s cold) measured 33.2 ms: a compile would have had to make
    # the default 2x faster, more than any compile did in the zoo (1.48x at most).
    base, pick = Settings(), Settings(memory_format="channels_last", amp="bf16")
    space = SearchSpace(name="s", knobs={"compile": ["off", "default"]}, compile_max_gain=1.6)
    far = [_r(base, 40.2), _r(pick, 19.8)]
    outcome = SearchOutcome(far, far[0], [], "s", current_environment(CPU), 0.0)
    assert compile_candidates(outcome, space, CPU, False, space.contest()) == [
        pick.model_copy(update={"compile": "default"})
    ]
    (dropped,) = [d for d in outcome.dropped if "default settings" in d.what]
    assert "2.03x the best eager candidate's" in dropped.reason and "1.6x" in dropped.reason
    # within reach (MobileNetV3-Small train: 1.2x), the default is compiled too
    near = [_r(base, 31.6), _r(pick, 26.4)]
    outcome = SearchOutcome(near, near[0], [], "s", current_environment(CPU), 0.0)
    assert Settings(compile="default") in compile_candidates(outcome, space, CPU, False, space.contest())
    # beyond the factor only by the point estimates, not beyond both intervals: compiled
    noisy = TrialResult(settings=base, status="ok",
                        measurement=Measurement(samples_ms=[20.0, 45.0, 33.0, 36.0, 60.0, 25.0]))  # fmt: skip
    outcome = SearchOutcome([noisy, far[1]], noisy, [], "s", current_environment(CPU), 0.0)
    assert Settings(compile="default") in compile_candidates(outcome, space, CPU, False, space.contest())


def test_apply_compiles_last_and_keeps_the_model_itself(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    settings = Settings(memory_format="channels_last", compile="default")
    tuned = advisor.apply_settings(settings, model, "cpu", warn=False)  # nothing compiles yet
    try:
        assert tuned.module is model and tuned.model is not model
        assert tuned.model._orig_mod is model  # torch.compile's wrapper around the tuned model
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert list(tuned.module.state_dict()) == ["0.weight", "0.bias"]  # checkpoints load
    finally:
        tuned.restore()
    eager = advisor.apply_settings(Settings(), model, "cpu", warn=False)
    assert eager.model is eager.module is model


# ---- what a compile costs, when it pays ------------------------------------------------------------


def test_break_even_is_the_compile_over_the_saving_per_step() -> None:
    eager = _r(Settings(), 10.0, first_ms=500.0)
    compiled = _r(Settings(compile="default"), 8.0, cold=20.5)
    b = bill(compiled, eager)
    # (20.5 s - the eager first call's 0.5 s) / 2 ms per step
    assert b.overhead_s == pytest.approx(20.0) and b.saving_ms == pytest.approx(2.0)
    assert b.steps == 10_000
    assert bill(_r(Settings(compile="default"), 11.0, cold=5.0), eager).steps == math.inf
    kept, out = paying([eager, compiled], eager, Contest(steps=9_999))
    assert kept == [eager] and out[0][0] is compiled
    assert paying([eager, compiled], eager, Contest(steps=10_000))[0] == [eager, compiled]
    assert paying([eager, compiled], eager, Contest())[0] == [eager, compiled]


def test_a_compile_wins_only_if_it_pays_within_the_steps() -> None:
    base = _r(Settings(), 10.0)
    cl = _r(Settings(memory_format="channels_last"), 9.0)
    compiled = _r(Settings(compile="default"), 5.0, cold=30.0)
    results = [base, cl, compiled]
    pick = decide(results, base, Contest())
    eager = pick.eager
    assert pick.chosen is compiled and eager is cl  # fastest per step; billed against cl
    pick = decide(results, base, Contest(steps=1_000))  # 30 s / 4 ms = 7,500 steps
    assert pick.chosen is cl
    assert "7,500 steps, more than the 1,000 steps" in pick.text()
    assert decide(results, base, Contest(steps=7_500)).chosen is compiled
    note = compile_note(results, compiled, cl, Contest())
    assert note is not None and "4.000 ms per step" in note
    assert "pays after about 7,500 steps" in note
    slower = _r(Settings(compile="default"), 12.0, cold=30.0)
    note = compile_note([base, slower], base, base, Contest())
    assert note is not None and "no faster per step" in note


def test_the_budget_leaves_compile_what_the_eager_stages_leave() -> None:
    space = load_space("cpu", CPU)
    eager = budget_plan(0.0, 600.0, space, per_layer=True)
    assert eager.compile is None and eager.search == pytest.approx(eager.layers * 2 / 3, rel=0.05)
    plan = budget_plan(0.0, 600.0, space, per_layer=True, compile=True)
    assert plan.search < plan.layers < plan.compile < plan.retime < plan.end == 600.0  # type: ignore[operator]
    assert plan.search == pytest.approx(2 * (plan.layers - plan.search))  # the search's double
    assert plan.compile - plan.layers == pytest.approx(plan.layers - plan.search)  # type: ignore[operator]
    assert plan.end - plan.retime >= 10.0  # the final check keeps a fresh process's start
    alone = budget_plan(0.0, 600.0, space, per_layer=False)
    assert alone.search == alone.layers and alone.end - alone.search < 0.25 * 600.0 + 1e-9


def test_the_stages_share_what_the_load_left_of_the_budget() -> None:
    # On an H200 a 60 s budget split from the run's start left the global knobs 5 s after a
    # 10 s start-up and load: two of twenty candidates measured, the default recommended.
    space = load_space("cpu", CPU)
    plan = budget_plan(0.0, 60.0, space, per_layer=True, compile=True, now=10.0)
    assert plan.end == 60.0  # the budget still counts from the start
    reserve = plan.end - plan.compile  # type: ignore[operator]
    assert plan.search - 10.0 == pytest.approx((60.0 - 10.0 - reserve) / 2)
    late = budget_plan(0.0, 60.0, space, per_layer=True, compile=True, now=59.0)
    assert late.search == late.layers == late.compile  # nothing left: every stage stops at once


def test_hitting_the_recompile_limit_is_named() -> None:
    from torch._dynamo.exc import FailOnRecompileLimitHit

    try:
        try:
            raise RuntimeError("cache limit")
        except RuntimeError as inner:
            raise FailOnRecompileLimitHit("Hard failure") from inner
    except FailOnRecompileLimitHit as e:
        reason = recompile_reason(e, cases=2)
    assert reason is not None and "recompiled the model more than 12 times" in reason
    assert recompile_reason(RuntimeError("other")) is None
    # within the guard, the function and the last guard failure Dynamo logs are named (EnCodec:
    # one conv forward, broken by a graph break, compiled per layer)
    log = logging.getLogger("torch._dynamo.convert_frame")
    with recompile_guard(cases=1):
        log.warning("torch._dynamo hit config.%s (%s)\n   function: %s\n   last reason: %s\n%s",
                    "recompile_limit", 10, "'resume_in_forward' (/site/x/modeling_encodec.py:162)",
                    "tensor '___stack0' requires_grad mismatch", "url")  # fmt: skip
        try:
            raise FailOnRecompileLimitHit("Hard failure")
        except FailOnRecompileLimitHit as e:
            reason = recompile_reason(e)
    assert reason is not None
    assert "recompiled 'resume_in_forward' (modeling_encodec.py:162) more than 10 times" in reason
    assert "its last: tensor '___stack0' requires_grad mismatch" in reason


def test_graph_breaks_are_named_by_place_once_each() -> None:
    """Dynamo's own record of where it broke the graph (eager backend: no Inductor here), each
    place once however often it is compiled again, and the compile note names them."""

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    torch.compiler.reset()
    compiled = torch.compile(f, backend="eager")
    for n in (2, 3, 4):  # other shapes compile again, at the same place
        compiled(torch.ones(n))
    breaks = advisor.compiled.graph_breaks()
    torch.compiler.reset()
    assert len(breaks) == 1, breaks
    assert breaks[0].startswith("test_compile.py:") and "graph_break" in breaks[0], breaks
    assert advisor.compiled.graph_breaks() == []  # Dynamo's reset clears the record
    slow = _r(Settings(compile="default"), 12.0).model_copy(
        update={"status": "failed", "measurement": None, "reason": "boom",
                "graph_breaks": breaks + ["other.py:9: Unsupported"]})  # fmt: skip
    note = compile_note([_r(Settings(), 10.0), slow], _r(Settings(), 10.0), _r(Settings(), 10.0),
                        Contest())  # fmt: skip
    assert note is not None and note.startswith("torch.compile (compile=default) was not accepted")
    assert f"(Dynamo broke its graph at 2 places; the first: {breaks[0]})" in note


def test_a_capture_failing_under_the_masks_is_named_the_gates() -> None:
    """Where the gate's dropout mode breaks a compiled model the timed steps ran (a graph break in
    the model, then an in-place activation before an in-place dropout), the reason says whose
    failure it is: not torch.compile's."""

    class Failing:
        def capture(self, record_convs: bool = False, canonical: bool = True) -> str:
            if canonical:
                raise RuntimeError("one of the variables needed ... modified by an inplace op")
            return "as timed"

    cand: Any = Failing()
    with pytest.raises(RuntimeError, match=r"the gate's capture under its dropout masks \(the "
                       r"compiled steps ran\): RuntimeError: one of the variables"):  # fmt: skip
        gating.capture(cand, compiled=True, dropout=True)
    assert gating.capture(cand, compiled=True, dropout=False) == "as timed"  # no masks drawn
    with pytest.raises(RuntimeError, match="^one of the variables"):  # eager: as it is
        gating.capture(cand, compiled=False, dropout=True)


# ---- compiled for real -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_compiled_candidate_is_measured_gated_and_billed_end_to_end(tmp_path: Path) -> None:
    """The compile stage end to end, with its bill: what docs/compile.md's --steps command runs
    on the bundled example."""
    space = _space(tmp_path, "{memory_format: [contiguous], compile: ['off', default]}")
    advice = advisor.advise(model_file=str(DATA / "tiny_cnn.py"), mode="infer", device="cpu",
                            space=space)  # fmt: skip
    rows = {r.settings.label(): r for r in advice.results}
    compiled = rows["compile=default"]
    assert compiled.status == "ok", compiled.reason
    m = compiled.measurement
    assert m is not None and compiled.compile_cold_s is not None
    eager = min((r for r in advice.results if r.status == "ok" and not r.settings.compiled),
                key=lambda r: r.median_ms)  # fmt: skip
    assert eager.measurement is not None
    # the compile is its first call, never a sample: the slowest sample is far under it
    assert m.first_call_ms is not None and max(m.samples_ms) < m.first_call_ms / 10
    assert compiled.rel_error is not None and compiled.rel_error < 1e-4  # fp32 class
    assert compiled.layer_error is None  # model level only: no conv runs alone in a graph
    assert compiled.graph_breaks == []  # a plain conv net compiles to one graph
    result = advice.config.result
    assert result is not None and result.compile_note and "torch.compile" in result.compile_note
    assert "compile" in advice.trials.columns
    if advice.settings.compiled:  # it won: only after holding in the final check
        assert result.final_check is not None and result.final_check.held


@pytest.mark.slow
def test_a_model_that_recompiles_on_every_call_fails_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(advisor.compiled, "BASE_RECOMPILES", 0)  # a limit of 2: fewer compiles
    workload = make_workload(model_file=str(DATA / "recompiles.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "infer", space)
    result = evaluate(workload, Settings(compile="default"), CPU, "infer", space, gate)
    assert result.status == "failed"
    reason = result.reason or ""
    assert "recompiled 'forward' (recompiles.py:15) more than 2 times" in reason, reason
    assert "its last: " in reason and "self.calls" in reason  # Dynamo's guard on the int


@pytest.mark.slow
def test_compiled_training_with_dropout_is_compared_under_the_canonical_masks() -> None:
    """Inductor draws its own dropout masks: the compiled step is captured under the gate's
    canonical masks (Dynamo traces the mode and draws them eagerly), and passes."""
    workload = make_workload(model_file=str(DATA / "dropout_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    assert gate.dropout  # the reference drew dropout masks
    result = evaluate(workload, Settings(compile="default"), CPU, "train", space, gate)
    assert result.status == "ok", result.reason
    assert result.rel_error is not None and result.rel_error < 1e-4
    assert result.grad_error is not None and result.grad_error < 1e-3
    # without the canonical masks the same compiled step drops other units: not comparable
    cand = Candidate(workload, Settings(compile="default"), CPU, "train", gate.seed)
    try:
        own = cand.capture(canonical=False)
    finally:
        cand.close()
    ref = gate.cases[0].outputs[0]
    assert float((own.outputs[0] - ref).norm() / ref.norm()) > 1e-2


@pytest.mark.slow
def test_a_compiled_candidate_that_loses_the_race_stops_before_the_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its capture under the dropout masks compiles the model again (23 s of MobileNetV3-Small's
    compile stage): a compiled candidate that loses the race (its margin covers windows apart)
    stops after its samples, measured and billed, not gated."""
    workload = make_workload(model_file=str(DATA / "dropout_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)

    def no_capture(*_a: object, **_k: object) -> None:
        raise AssertionError("captured a candidate that cannot win")

    monkeypatch.setattr(gating, "capture", no_capture)
    race = Race(limit_ms=1e-6, bar_ms=1e-6)  # every sample far above the bar
    result = evaluate(workload, Settings(compile="default"), CPU, "train", space, gate,
                      race=race)  # fmt: skip
    assert result.status == "stopped" and "slower than" in (result.reason or "")
    m = result.measurement
    assert m is not None and len(m.samples_ms) >= 3
    assert result.compile_cold_s is not None and result.compile_cold_s > 0
    assert result.rel_error is None  # not gated
    eager = _r(Settings(), m.median_ms / 2)
    note = compile_note([eager, result], eager, eager, Contest())
    assert note is not None and "was slower per step than default" in note
    assert "it never pays" in note


@pytest.mark.slow  # a train-mode compile (5 s); test_effort's eager answer runs the compile stage
def test_a_compiled_candidate_above_a_bar_from_another_window_is_gated() -> None:
    """Slower than the eager leader's interval from the search, but within the race's margin:
    MobileNetV3-Small train's compile stopped at 27.1 ms against a bar of 22.7 ms, and the
    re-time then measured that eager leader at 29.5 ms. It is not stopped by the bar: under
    dropout its capture (a second compile) waits for the pick, and the re-time decides."""
    workload = make_workload(model_file=str(DATA / "dropout_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    assert gate.dropout
    race = Race(limit_ms=1e9, bar_ms=1e-6)  # the race never stops it; the bar is below
    result = evaluate(workload, Settings(compile="default"), CPU, "train", space, gate,
                      race=race)  # fmt: skip
    assert result.status == "ok" and result.stop is None and result.pending == "capture"


@pytest.mark.slow
def test_without_dropout_a_compiled_candidate_is_gated_and_left_to_the_retime() -> None:
    # Its capture runs the compiled step as timed (nothing compiles again), and the bar it would
    # be stopped at came from an earlier window: resnet18 train stopped at 44.9 ms against an
    # eager leader at 42.9 ms that the re-time then measured at 47.2 ms.
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    assert not gate.dropout
    race = Race(limit_ms=1e9, bar_ms=1e-6)
    result = evaluate(workload, Settings(compile="default"), CPU, "train", space, gate,
                      race=race)  # fmt: skip
    assert result.status == "ok" and result.rel_error is not None


def test_the_twin_counts_only_when_measured_in_the_compiled_candidates_window() -> None:
    # A MobileNetV3-Small run: the compiled candidate re-timed at 7.5 ms beside the default at
    # 10.5 ms; its eager twin's 5.7 ms came from its trial, an earlier window. That figure must
    # not make the compile "no faster per step" than the twin.
    cl = Settings(memory_format="channels_last")
    base = _r(Settings(), 10.5)
    twin = _r(cl, 5.7, retimed=False)
    compiled = _r(cl.model_copy(update={"compile": "default"}), 7.5, cold=20.0)
    assert alternative(compiled, [base, twin, compiled], base) is base
    retimed_twin = _r(cl, 7.0)  # re-timed with it: the alternative
    assert alternative(compiled, [base, retimed_twin, compiled], base) is retimed_twin


def test_a_compile_is_billed_against_its_eager_twin_when_noise_kept_the_default() -> None:
    # Issue 30's run: the default re-timed with a 39-226 ms interval, channels_last + bf16
    # (eager) at 21.38 ms and its compiled twin at 20.40 ms. A noisy round can leave the eager
    # pick at the default; the compile must still be billed against the twin the user would run.
    cl_bf16 = Settings(memory_format="channels_last", amp="bf16")
    base = _r(Settings(), 40.49, first_ms=200.0)
    twin = _r(cl_bf16, 21.38, first_ms=200.0)
    compiled = _r(cl_bf16.model_copy(update={"compile": "default"}), 20.40, cold=7.0)
    results = [base, twin, compiled]
    assert alternative(compiled, results, base) is twin
    b = bill(compiled, twin)
    assert b.saving_ms == pytest.approx(0.98) and b.steps == 6_939  # (7.0 - 0.2) s / 0.98 ms
    note = compile_note(results, compiled, base, Contest())
    assert (
        note is not None
        and "over memory_format=channels_last, amp=bf16;" in note
        and "6,939 steps" in note
    )
    # Within the default horizon it competes; with a slower compile it does not, and says why.
    slow = _r(compiled.settings, 20.40, cold=12.0)  # 11.8 s / 0.98 ms = 12,041 steps
    kept, out = paying([base, twin, slow], base, Contest())
    assert kept == [base, twin] and out[0][1].steps == 12_041
    pick = decide([base, twin, slow], base, Contest())
    assert pick.chosen is twin and "10,000-step horizon" in pick.text()
    note = compile_note([base, twin, slow], twin, twin, Contest())
    assert note is not None and "10,000-step horizon" in note and "not recommended" in note


def test_a_compile_of_a_graph_compiled_for_another_candidate_is_billed_that_ones_cold_compile(
) -> None:
    # MobileNetV3-Small train on a Zen 4: channels_last + bf16 fp32 convs and channels_last,
    # both compiled, are one graph (oneDNN reads the precision as each conv runs); the second
    # read it from the first's caches, and its bill is the first's cold compile, named.
    cl = Settings(memory_format="channels_last", compile="default")
    first = _r(cl, 33.0, cold=66.0)
    second = _r(cl.model_copy(update={"cpu_fp32": "bf16"}), 31.0, first_ms=900.0)
    eager = _r(Settings(memory_format="channels_last", cpu_fp32="bf16"), 33.7, first_ms=100.0)
    results = [eager, first, second]
    assert paid_by(second, results) is first and paid_by(first, results) is first
    assert bill(second, eager, results).overhead_s == pytest.approx(65.9)  # not its 0.9 s read
    note = compile_note(results, eager, eager, Contest())
    assert note is not None and "65.9 s more with empty caches (measured compiling " in note
    assert "memory_format=channels_last, compile=default: the same graph)" in note
    # Another graph (autocast) is not the same compile; a read whose compile is not among the
    # results has no bill to pay back with: it never pays.
    amp = _r(cl.model_copy(update={"amp": "bf16"}), 20.0, first_ms=900.0)
    assert paid_by(amp, [*results, amp]) is amp
    assert one_off_s(second, [eager, second]) == math.inf
    assert paying([eager, second], eager, Contest())[0] == [eager]


@pytest.mark.slow
def test_a_graph_compiled_for_one_candidate_is_read_not_compiled_again_for_its_twin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two compiled candidates that differ only in the fp32 conv precision: the second reads
    the first's graph from its caches (no cold compile of its own), and runs its own precision."""
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    cl = Settings(memory_format="channels_last", compile="default")
    first = evaluate(workload, cl, CPU, "train", space, gate)
    second = evaluate(workload, cl.model_copy(update={"cpu_fp32": "bf16"}), CPU, "train",
                      space, gate)  # fmt: skip
    assert first.status == second.status == "ok", (first.reason, second.reason)
    assert first.compile_cold_s is not None and second.compile_cold_s is None
    assert first.measurement is not None and second.measurement is not None
    read = (second.measurement.first_call_ms or 0.0) / 1e3
    assert read < first.compile_cold_s / 2  # read, not compiled
    assert one_off_s(second, [first, second]) == first.compile_cold_s  # billed the cold compile
    other = evaluate(workload, cl.model_copy(update={"amp": "bf16"}), CPU, "train", space, gate)
    assert other.status == "ok" and other.compile_cold_s is not None  # another graph: cold
    # With Inductor's graph cache off nothing is read: the twin compiles cold, once.
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    again = evaluate(workload, second.settings, CPU, "train", space, gate)
    assert again.status == "ok" and again.compile_cold_s is not None


def test_a_compiled_candidate_races_the_fastest_eager_one() -> None:
    base, cl = _r(Settings(), 10.0), _r(Settings(memory_format="channels_last"), 8.0)
    compiled = _r(Settings(compile="default"), 1.0, cold=5.0)  # not its own yardstick
    outcome = SearchOutcome([base, cl, compiled], base, [], "s", current_environment(CPU), 0.0)
    space = SearchSpace(name="s", knobs={"compile": ["off", "default"]})
    race = compile_race(outcome, space.contest())
    assert race is not None and race.bar_ms == pytest.approx(8.0 * (1 + space.min_gain))
    assert race.limit_ms == pytest.approx(8.0 * (1 + space.min_gain) * space.race_margin)
    off = SearchSpace(name="s", knobs={"compile": ["off", "default"]}, race=False)
    assert compile_race(outcome, off.contest()) is None


@pytest.mark.slow
def test_in_place_activations_and_dropout_compile_and_train_under_the_canonical_masks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MobileNetV3's classifier (Hardswish(inplace=True) then Dropout(inplace=True)) trains under
    torch.compile, so its compiled candidate is measured and judged, not failed: the gate's
    capture under the canonical masks must leave the model one graph (issue 30, item 3)."""
    workload = make_workload(model_file=str(DATA / "inplace_dropout.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), CPU)
    gate = Gate(workload, CPU, "train", space)
    assert gate.dropout
    compiled = Settings(compile="default")
    result = evaluate(workload, compiled, CPU, "train", space, gate)
    assert result.status == "ok", result.reason
    assert result.rel_error is not None and result.rel_error < 1e-4  # the eager reference's
    assert result.grad_error is not None and result.grad_error < 1e-3  # masks, to fp32 noise
    # that capture compiled the model again, under the masks: its seconds are counted apart
    assert result.compile_check_s is not None and result.compile_check_s > 0
    # The gate still sees a wrong compiled model: the same one with its output 5% off.
    apply_module = importlib.import_module("advisor.apply")  # `advisor.apply` is the function
    real = apply_module.compile_model

    def off(model: torch.nn.Module, settings: Settings) -> torch.nn.Module:
        if settings.compiled:  # the references (the noise floor's too) stay right
            model.register_forward_hook(lambda _m, _a, out: out * 1.05)
        return real(model, settings)

    monkeypatch.setattr(apply_module, "compile_model", off)
    torch.compiler.reset()  # Dynamo does not guard on hooks: the graph above would run on
    cand = Candidate(workload, compiled, CPU, "train", gate.seed)
    try:
        got = cand.capture(record_convs=False)
    finally:
        cand.close()
    errors = compare(got, gate.cases[0], "train")
    assert errors.out > 0.04
    assert gate.tolerance(compiled, errors).judge(errors) is not None


def test_a_kept_artifact_is_never_rewritten_by_a_later_compiles() -> None:
    # A kernel library this process loaded from the run's folder, rewritten in place by the
    # next cold compile's copy, crashed it (the tests' process, then a worker reading a graph).
    with advisor.compiled.shared_measurement_cache() as run:
        kept = advisor.compiled.measurement_cache() / "kernels" / "k1.so"
        kept.parent.mkdir()
        kept.write_bytes(b"loaded")
        cold = advisor.compiled.cold_cache()
        (cold / "kernels").mkdir()
        (cold / "kernels" / "k1.so").write_bytes(b"same name, built elsewhere")
        (cold / "kernels" / "k2.so").write_bytes(b"new")
        advisor.compiled.keep_artifacts(cold)
        assert kept.read_bytes() == b"loaded" and not cold.exists()
        assert (kept.parent / "k2.so").read_bytes() == b"new"
        assert run.is_dir()


USER_COMPILE = """
import torch
from torch._dynamo.utils import counters
f = torch.compile(lambda x: torch.relu(x) * 2 + OFFSET)
f(torch.arange(8.0))
print(counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""
# A worker of the run: Inductor started in the folder the user's compile reads, then a cold
# compile in an empty folder, its artifacts kept in the run's folder.
RUN_COMPILE = """
import torch
from advisor.compiled import cold_cache, inductor_caches, keep_artifacts, start_inductor
start_inductor()
cold = cold_cache()
with inductor_caches(cold):
    torch.compile(lambda x: torch.relu(x) * 2 + OFFSET)(torch.arange(8.0))
keep_artifacts(cold)
"""


@pytest.mark.slow  # Inductor's start, a cold compile, then the user's compile (7 s)
def test_a_compiled_pick_leaves_its_caches_where_the_users_compile_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The user's first training step should compile from what the run compiled (as the final
    # check's fresh process does), not pay a cold compile again. Inductor's start-up artifacts
    # are already there: the run starts Inductor in that same folder (`start_inductor`).
    from advisor.compiled import leave_for_training, shared_measurement_cache, training_cache

    user = tmp_path / "user-inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(user))
    assert training_cache() == user
    # This test's processes read Inductor's default folder (started by earlier tests, as on a
    # machine where torch.compile ran before), with a graph no other compile there has.
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    offset = f"{1 + uuid.uuid4().int % 10**6 / 10**7!r}"

    def fresh(code: str) -> str:  # processes started as the run's workers and the user's are
        out = python_code(code.replace("OFFSET", offset))
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    with shared_measurement_cache() as run:
        assert leave_for_training(run) is None  # nothing compiled: nothing to leave
        fresh(RUN_COMPILE)
        assert leave_for_training(run) == training_cache()
    hits, misses = map(int, fresh(USER_COMPILE).split()[-2:])
    assert (hits, misses) == (1, 0)
