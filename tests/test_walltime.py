"""Where a run's time goes: the stage clock, the breakdown with its parts, its one line."""

from __future__ import annotations

import re
import sys
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from advisor.config import FinalCheck
from advisor.execute.retime import retimed_results
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.measure.verdict import PrecisionCheck
from advisor.report.progress import ProgressReporter
from advisor.service import _stage_reporter
from advisor.stages.walltime import (
    LOAD,
    TIMED,
    StageClock,
    breakdown,
    breakdown_line,
    gate_s,
    harness_share,
    timed_by_stage,
)


def _check(amp: str, seconds: float) -> PrecisionCheck:
    own = Settings(amp=amp)  # type: ignore[arg-type]
    return PrecisionCheck(precision=amp, own_path=own, mode="train", accepted=True,
                          summary=f"{amp}: ok", gap=0.0, band=0.1, seconds=seconds)  # fmt: skip


def test_the_clock_adds_up_spans_and_reports_each_as_it_ends() -> None:
    told: list[tuple[str, float, float]] = []
    clock = StageClock(time.perf_counter() - 2.0, lambda s, t, all_s: told.append((s, t, all_s)))
    clock.until_now(LOAD)
    for _ in range(2):
        with clock.stage("re-time"):
            time.sleep(0.01)
    with pytest.raises(RuntimeError), clock.stage("compile"):
        raise RuntimeError("a failing stage still counts")
    # a stage that raised counts its time but is not told as done (its error is the one line)
    assert [s for s, _, _ in told] == [LOAD, "re-time", "re-time"] and "compile" in clock.spans
    assert clock.spans[LOAD] >= 2.0
    # each span's own time, and its stage's so far: the second span is told with both
    assert told[1][2] == told[1][1]
    assert clock.spans["re-time"] == told[2][2] == pytest.approx(told[1][1] + told[2][1])


def test_a_resumed_stage_says_it_is_done_again_with_its_time_in_all() -> None:
    console = Console(record=True, width=120)
    reporter = ProgressReporter(console=console)
    clock = StageClock(time.perf_counter(), _stage_reporter(reporter.update))
    for stage in ("global knobs", "re-time", "global knobs"):
        with clock.stage(stage):
            time.sleep(0.06)
    lines = console.export_text().splitlines()
    assert re.fullmatch(r"global knobs: done in \d+\.\d s", lines[0])
    assert re.fullmatch(r"re-time: done in \d+\.\d s", lines[1])
    assert re.fullmatch(r"global knobs: done in \d+\.\d s more, \d+\.\d s in all", lines[2])


def test_breakdown_orders_stages_and_counts_each_precision_check_once() -> None:
    bf16 = _check("bf16", 4.0)
    results = [
        TrialResult(settings=Settings(), status="ok"),
        TrialResult(settings=Settings(amp="bf16"), status="ok", precision_check=bf16),
        # a second candidate at bf16 carries the same verdict: measured once
        TrialResult(
            settings=Settings(amp="bf16", memory_format="channels_last"),
            status="ok",
            precision_check=bf16,
        ),  # fmt: skip
        TrialResult(
            settings=Settings(compile="default"),
            status="ok",
            compile_cold_s=6.5,
            compile_start_s=2.0,
        ),  # fmt: skip
        TrialResult(settings=Settings(compile="default", amp="bf16"), status="failed"),
    ]
    spans = {"final check": 2.0, "compile": 9.0, "global knobs": 12.0, LOAD: 3.0}
    out = breakdown(spans, results, total_s=27.5)
    assert list(out) == [LOAD, "global knobs", "global knobs: precision checks", "compile",
                         "compile: Inductor start", "compile: cold compiles", "final check",
                         "other", "total", TIMED]  # fmt: skip
    assert out["global knobs: precision checks"] == 4.0
    assert out["compile: Inductor start"] == 2.0
    assert out["compile: cold compiles"] == 6.5
    assert out["other"] == pytest.approx(1.5)
    line = breakdown_line(out)
    assert line.startswith("start-up and load 3.0 s, global knobs 12.0 s (precision checks 4.0 s)")
    assert "compile 9.0 s (Inductor start 2.0 s, cold compiles 6.5 s)" in line
    assert line.endswith("; total 27.5 s, 0.0 s of it in timed samples (harness 100%; 100% "
                         "with the gate's checks counted apart)")  # fmt: skip


def test_the_timed_samples_and_the_harness_share() -> None:
    # 4 samples of 2 calls at 250 ms a call: 2 s timed; a shape set counts each shape's samples
    m = Measurement(samples_ms=[250.0] * 4, reps=2)
    shapes = [Measurement(samples_ms=[100.0] * 5), Measurement(samples_ms=[300.0] * 5)]
    results = [
        TrialResult(settings=Settings(), status="ok", measurement=m),
        TrialResult(settings=Settings(amp="bf16"), status="ok", measurement=m, per_shape=shapes),
        TrialResult(settings=Settings(memory_format="channels_last"), status="failed"),
    ]
    assert sum(timed_by_stage(results).values()) == pytest.approx(2.0 + 0.5 + 1.5)
    out = breakdown({LOAD: 1.0, "global knobs": 7.0}, results, total_s=8.0)
    assert out[TIMED] == pytest.approx(4.0) and harness_share(out) == pytest.approx(0.5)
    assert breakdown_line(out).endswith("4.0 s of it in timed samples (harness 50%)")
    # a final check's rounds are the final check's samples (a second check's too)
    check = FinalCheck(where="fresh process", speedup=1.2, speedup_ci=(1.1, 1.3), rounds=4,
                       held=True, measured=[(2, [250.0] * 4), (1, [125.0] * 4)])  # fmt: skip
    out = breakdown({LOAD: 1.0, "global knobs": 7.0, "final check": 6.0}, results, 14.0,
                    final=[check, check])  # fmt: skip
    assert out[f"final check: {TIMED}"] == pytest.approx(2 * (2.0 + 0.5))
    assert out[TIMED] == pytest.approx(4.0 + 5.0)
    # results reused from an earlier run never make the share negative
    assert harness_share(breakdown({}, results, total_s=1.0)) == 0.0


def test_the_gates_checks_are_a_part_of_their_stage_and_can_be_counted_apart() -> None:
    # Captures and layer checks (gate_s) belong to the stage of their candidate: an eager one
    # without layer swaps to the global knobs, one with swaps to the per-layer stage; a compiled
    # one's are not split out (its capture may compile, which the compile stage's parts count).
    m = Measurement(samples_ms=[250.0] * 4, reps=2)  # 2 s timed per candidate
    results = [
        TrialResult(settings=Settings(), status="ok", measurement=m, gate_s=0.5),
        TrialResult(settings=Settings(amp="bf16"), status="ok", measurement=m, gate_s=0.25,
                    precision_check=_check("bf16", 1.5)),
        TrialResult(settings=Settings(layers={"0": "unfold_gemm"}), status="ok", gate_s=0.75),
        TrialResult(settings=Settings(compile="default"), status="ok", gate_s=9.0),
    ]  # fmt: skip
    out = breakdown({"global knobs": 7.0, "per-layer": 2.0, "compile": 10.0}, results, 20.0)
    assert out["global knobs: output and layer checks"] == 0.75
    assert out["global knobs: precision checks"] == 1.5
    assert out["per-layer: output and layer checks"] == 0.75
    assert gate_s(out) == pytest.approx(3.0)
    # 4 s timed of 20 s: 80% outside; the gate's 3 s apart, 4 of 17 s: 76%
    assert harness_share(out) == pytest.approx(0.8)
    assert harness_share(out, gate_apart=True) == pytest.approx(1 - 4 / 17)
    line = breakdown_line(out)
    assert "global knobs 7.0 s (precision checks 1.5 s, output and layer checks 0.8 s, timed " \
        "samples 4.0 s)" in line  # fmt: skip
    assert line.endswith("(harness 80%; 76% with the gate's checks counted apart)")


def test_the_timed_samples_are_split_by_the_stage_that_took_them() -> None:
    # A global-knobs trial (screen 0.3 s, samples 1 s) re-timed twice (0.2 s, 0.1 s), a
    # per-layer one (0.5 s) and a compiled one (0.4 s, and 0.6 s of payback rounds beside its
    # rival: the rival's samples too), never re-timed.
    trial = TrialResult(settings=Settings(amp="bf16"), status="ok",
                        measurement=Measurement(samples_ms=[100.0] * 10),
                        screen=Measurement(samples_ms=[100.0] * 3))  # fmt: skip
    wl = SimpleNamespace(shape_weights=(1.0,))
    once = retimed_results(wl, [trial], [[[50.0] * 4]])[0]  # type: ignore[arg-type]
    twice = retimed_results(wl, [once], [[[25.0] * 4]])[0]  # type: ignore[arg-type]
    layers = TrialResult(settings=Settings(layers={"0": "unfold_gemm"}), status="ok",
                         measurement=Measurement(samples_ms=[250.0, 250.0]))  # fmt: skip
    rounds = [Measurement(samples_ms=[50.0] * 4, reps=2), Measurement(samples_ms=[100.0] * 2)]
    compiled = TrialResult(settings=Settings(compile="default"), status="ok",
                           measurement=Measurement(samples_ms=[100.0] * 2, reps=2),
                           payback=rounds)  # fmt: skip
    by_stage = timed_by_stage([twice, layers, compiled])
    assert by_stage == pytest.approx({"global knobs": 1.3, "re-time": 0.3, "per-layer": 0.5,
                                      "compile": 1.0})  # fmt: skip
    out = breakdown({"global knobs": 3.0, "re-time": 0.5}, [twice], total_s=3.5)
    assert out["global knobs: timed samples"] == 1.3 and out["re-time: timed samples"] == 0.3


def test_a_retime_keeps_the_samples_it_replaced_in_the_count() -> None:
    # The finalists' re-time replaces their measurements: the trial's samples (and a screen's)
    # were still taken, and an earlier re-time's too. Two re-times of one finalist, 2 shapes.
    shapes = [Measurement(samples_ms=[100.0] * 5), Measurement(samples_ms=[300.0] * 5)]
    trial = TrialResult(settings=Settings(amp="bf16"), status="ok", measurement=shapes[0],
                        per_shape=shapes, screen=Measurement(samples_ms=[200.0] * 3))  # fmt: skip
    wl = SimpleNamespace(shape_weights=(1.0, 1.0))
    once = retimed_results(wl, [trial], [[[10.0] * 4], [[30.0] * 4]])[0]  # type: ignore[arg-type]
    twice = retimed_results(wl, [once], [[[20.0] * 2], [[40.0] * 2]])[0]  # type: ignore[arg-type]
    assert once.replaced == shapes and twice.replaced == [*shapes, *once.per_shape]
    assert twice.retimed and [m.samples_ms for m in twice.per_shape] == [[20.0] * 2, [40.0] * 2]
    # 2.0 s trial + 0.6 s screen + 0.16 s first re-time + 0.12 s second
    assert sum(timed_by_stage([twice]).values()) == pytest.approx(2.0 + 0.6 + 0.16 + 0.12)


def test_a_part_never_exceeds_its_stage() -> None:
    # A verdict's seconds are those of the run that measured it (possibly an earlier run of the
    # study): the part shown is never more than the stage it sits in.
    results = [TrialResult(settings=Settings(amp="bf16"), status="ok",
                           precision_check=_check("bf16", 30.0))]  # fmt: skip
    out = breakdown({"global knobs": 5.0}, results, total_s=5.0)
    assert out["global knobs: precision checks"] == 5.0
    # nor do a stage's parts add up to more than it: reused figures fill what is left, no more
    compiled = [TrialResult(settings=Settings(compile="default"), status="ok",
                            compile_start_s=4.0, compile_cold_s=9.0)]  # fmt: skip
    out = breakdown({"compile": 10.0}, compiled, total_s=10.0)
    assert (out["compile: Inductor start"], out["compile: cold compiles"]) == (4.0, 6.0)


def test_the_gates_compile_under_dropout_masks_is_a_part_of_the_compile_stage() -> None:
    # A compile stage of 84 s: Inductor's start, the cold compile, and the gate's capture, which
    # compiles the model again under its dropout masks (the figures are the test's own).
    compiled = [TrialResult(settings=Settings(compile="default"), status="ok",
                            compile_start_s=3.0, compile_cold_s=52.0, compile_check_s=20.0)]  # fmt: skip
    out = breakdown({"compile": 84.0}, compiled, total_s=84.0)
    assert out["compile: gate's compiles"] == 20.0
    assert "compile 84.0 s (Inductor start 3.0 s, cold compiles 52.0 s, gate's compiles 20.0 s)" \
        in breakdown_line(out)  # fmt: skip
    assert "compile: gate's compiles" not in breakdown({"compile": 5.0}, [], total_s=5.0)


def test_the_trials_table_shows_inductors_start_on_the_trial_that_paid_it() -> None:
    import math

    from advisor.advice import trial_row

    base = TrialResult(settings=Settings(), status="ok")
    paid = TrialResult(settings=Settings(compile="default"), status="ok", compile_start_s=4.2,
                       compile_cold_s=8.5)  # fmt: skip
    assert trial_row((-1, "compile"), paid, base)["compile_start_s"] == 4.2
    assert math.isnan(trial_row((0, "search"), base, base)["compile_start_s"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_process_age_grows_with_the_clock() -> None:
    from advisor.stages.walltime import process_age_s

    first = process_age_s()
    time.sleep(0.05)
    second = process_age_s()
    assert first is not None and second is not None
    assert first > 0 and second - first >= 0.03  # /proc counts in clock ticks (10 ms)


def test_first_calls_searches_and_warm_ups_are_parts_of_their_eager_stage() -> None:
    """An eager candidate's first call, cuDNN's search (a cudnn.benchmark twin's first call) and
    its warm-up are named in its stage, from the trial's own record: a re-time's measurements
    are not its trial's, a survivor resumed on its screen paid the screen's first call once, and
    a compiled candidate's first call is its cold compile (a part of the compile stage)."""
    def m(first_ms: float, warm_s: float) -> Measurement:
        return Measurement(samples_ms=[10.0] * 5, first_call_ms=first_ms, warmup_s=warm_s)

    screen = m(800.0, 0.1)
    resumed = m(800.0, 0.05)  # its full timing on the screen's built candidate
    results = [
        TrialResult(settings=Settings(), status="ok", measurement=m(500.0, 0.2)),
        TrialResult(settings=Settings(memory_format="channels_last"), status="ok",
                    measurement=resumed, screen=screen),  # fmt: skip
        TrialResult(settings=Settings(cudnn_benchmark=True), status="ok",
                    measurement=m(15_000.0, 0.1)),  # fmt: skip
        # re-timed: its trial's measurement is the first of `replaced`
        TrialResult(settings=Settings(amp="bf16"), status="ok", measurement=m(9.0, 9.0),
                    replaced=[m(1_000.0, 0.3)], retimed=True),  # fmt: skip
        TrialResult(settings=Settings(layers={"0": "unfold_gemm"}), status="ok",
                    measurement=m(250.0, 0.1)),  # fmt: skip
        TrialResult(settings=Settings(compile="default"), status="ok",
                    measurement=m(30_000.0, 0.5), compile_cold_s=30.0),  # fmt: skip
    ]
    spans = {"global knobs": 30.0, "per-layer": 1.0, "compile": 40.0}
    out = breakdown(spans, results, total_s=71.0)
    assert out["global knobs: cuDNN's searches"] == pytest.approx(15.0)
    assert out["global knobs: first calls"] == pytest.approx(0.5 + 0.8 + 1.0)
    assert out["global knobs: warm-ups"] == pytest.approx(0.2 + 0.1 + 0.05 + 0.1 + 0.3)
    assert out["per-layer: first calls"] == pytest.approx(0.25)
    assert out["per-layer: warm-ups"] == pytest.approx(0.1)
    assert "compile: first calls" not in out and out["compile: cold compiles"] == 30.0
    line = breakdown_line(out)
    assert "global knobs 30.0 s (cuDNN's searches 15.0 s, first calls 2.3 s, warm-ups 0.8 s, " \
        "timed samples " in line  # fmt: skip
    # the harness share is what it was: parts name the harness, they do not move it
    assert harness_share(out) == pytest.approx(1 - sum(timed_by_stage(results).values()) / 71.0)


def test_the_per_layer_stages_own_layer_measurements_are_its_parts() -> None:
    # Two layer trials (a layer workload's candidates: conv_impl set, no layer swaps), 0.6 s of
    # samples between them, first calls of 0.2 s, warm-ups of 0.1 s and checks of 0.3 s: all
    # the per-layer stage's, though their settings read as a global candidate's.
    def layer(impl: str) -> TrialResult:
        m = Measurement(samples_ms=[100.0] * 3, first_call_ms=100.0, warmup_s=0.05)
        return TrialResult(settings=Settings(conv_impl=impl), status="ok", measurement=m,
                           gate_s=0.15)  # fmt: skip

    layers = [layer("native"), layer("unfold_gemm")]
    out = breakdown({"global knobs": 1.0, "per-layer": 4.0}, [], 5.0, layers=layers)
    assert out["per-layer: timed samples"] == pytest.approx(0.6)
    assert out["per-layer: first calls"] == pytest.approx(0.2)
    assert out["per-layer: warm-ups"] == pytest.approx(0.1)
    assert out["per-layer: output and layer checks"] == pytest.approx(0.3)
    assert "global knobs: timed samples" not in out and out[TIMED] == pytest.approx(0.6)


def test_a_layers_autotuning_and_cudnns_searches_are_named_parts_of_the_per_layer_stage() -> None:
    # An H200 run's per-layer stage under cudnn.benchmark named 17 of its 169.5 s: its layers'
    # first calls (Triton's autotuning, cuDNN's searches) were counted as searches, which the
    # stage did not show. A Triton layer stopped at its allowance had no measurement at all.
    from advisor.measure.stop import Stop

    def layer(impl: str, first_ms: float) -> TrialResult:
        m = Measurement(samples_ms=[1.0] * 3, first_call_ms=first_ms, warmup_s=0.0)
        return TrialResult(settings=Settings(conv_impl=impl, cudnn_benchmark=True), status="ok",
                           measurement=m)  # fmt: skip

    stopped = TrialResult(settings=Settings(conv_impl="triton", cudnn_benchmark=True),
                          status="stopped", stop=Stop(kind="cannot_pay", horizon_steps=10,
                                                      saving_ms=0.1, cold_s=3.0,
                                                      one_off="autotuning"))  # fmt: skip
    layers = [layer("native", 500.0), layer("triton", 4_000.0), stopped]
    out = breakdown({"per-layer": 10.0}, [], 10.0, layers=layers)
    assert out["per-layer: autotuning"] == pytest.approx(7.0)
    assert out["per-layer: cuDNN's searches"] == pytest.approx(0.5)
