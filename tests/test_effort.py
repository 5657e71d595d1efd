"""Effort levels (advisor.stages.effort), screening before full timing (advisor.search.screen) and
the eager answer written before the compile stage (advisor.service, advisor.cli)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

import advisor
from advisor.errors import AdvisorError
from advisor.knobs import Settings
from advisor.measure.contest import SCREEN_SAMPLES, Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Race
from advisor.measure.stop import Stop
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import measure
from advisor.search.options import SearchOptions
from advisor.search.run import search
from advisor.search.screen import (
    SCREEN_MIN_STEP_MS,
    inversion,
    min_step_ms,
    record_dropped,
    screen,
)
from advisor.search.study import open_plan
from advisor.space import compile_modes, load_space
from advisor.stages.effort import effort_of
from advisor.workload.args import make_workload
from tests._advise_run import AdviseRun
from tests._cli import advisor_cli
from tests.conftest import DATA, FAST_SPACE

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


class Clock:
    """Each step takes a scripted time: exact samples."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.step_s


# ---- what each level changes in the space --------------------------------------------------------


def test_quick_searches_the_global_knobs_only() -> None:
    sp = load_space("cpu", CPU)
    quick = effort_of("quick").space(sp, CPU)
    assert quick.knobs["conv_impl"] == ["native"] and quick.knobs["compile"] == ["off"]
    assert not quick.per_layer and compile_modes(quick, CPU)[0] == []
    assert quick.timing.min_samples <= 5 and quick.timing.max_time_s <= 0.5
    # the global knobs themselves are all still searched
    for knob in ("memory_format", "amp", "cpu_fp32"):
        assert quick.knobs[knob] == sp.knobs[knob]


def test_quick_and_default_screen_and_full_times_every_candidate_in_full() -> None:
    # the docs said default screens while it did not: bf16 on a CPU without bf16 units (30x
    # the default's step) then ran two warm-ups and three samples where a screen stops after one
    assert effort_of("quick").screens and effort_of("default").screens
    assert not effort_of("full").screens


def test_default_compiles_the_default_mode_and_full_every_mode() -> None:
    sp = load_space("cuda", CUDA)
    default = effort_of("default").space(sp, CUDA)
    full = effort_of("full").space(sp, CUDA)
    assert compile_modes(default, CUDA)[0] == ["default"]
    assert set(compile_modes(sp, CUDA)[0]) < set(compile_modes(full, CUDA)[0])
    assert "max-autotune" in compile_modes(full, CUDA)[0]
    assert full.timing.min_samples == 2 * sp.timing.min_samples
    assert full.budget.time_s == 2 * sp.budget.time_s and full.retime_top == sp.retime_top + 1
    # on a CPU Inductor has no conv templates: full adds no max-autotune there
    cpu = load_space("cpu", CPU)
    assert "max-autotune" not in effort_of("full").space(cpu, CPU).knobs["compile"]
    # a space without a compile knob gets none
    fast = load_space(FAST_SPACE, CPU)
    for level in ("quick", "default", "full"):
        assert "compile" not in effort_of(level).space(fast, CPU).knobs


def test_an_unknown_effort_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AdvisorError, match="unknown effort 'fast'"):
        effort_of("fast")
    r = advisor_cli("advise", str(DATA / "tiny_cnn.py"), "--effort", "fast", cwd=tmp_path)
    assert r.returncode == 2 and "invalid choice: 'fast'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "tuned.json").exists()


# ---- screening ---------------------------------------------------------------------------------


def test_a_screen_takes_its_samples_and_stops() -> None:
    clock = Clock(0.010)
    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=7, max_samples=100,
                          target_rel_ci=1e-9, max_time_s=100)  # fmt: skip
    m = measure(clock.step, CPU, policy, clock=clock, race=Race(float("inf"), screen=3))
    assert len(m.samples_ms) == 3 and m.stop == "screened"
    assert m.median_ms == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("step_ms", "limit_ms", "samples"),
    [
        (10.0, 4.0, 2),  # warm-ups above twice the limit: two in a row past the policy's decide
        (10.0, 8.0, 2),  # warm-ups under twice the limit: two samples of three decide
        (10.0, 12.0, 3),  # under the limit: the whole screen
    ],
)
def test_a_screen_above_the_drop_line_stops_once_its_median_is_known(
    step_ms: float, limit_ms: float, samples: int
) -> None:
    clock = Clock(step_ms / 1e3)
    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=7, max_samples=100,
                          target_rel_ci=1e-9, max_time_s=100)  # fmt: skip
    m = measure(clock.step, CPU, policy, clock=clock, race=Race(limit_ms, screen=3))
    assert len(m.samples_ms) == samples and m.stop is not None
    assert m.warmup_runs == 2  # the policy's: never evidence for a cut
    assert m.stop == ("cut" if step_ms > 2 * limit_ms else "screened")
    assert m.median_ms == pytest.approx(step_ms)
    assert m.warmup_s is not None and m.sampling_s == pytest.approx(samples * step_ms / 1e3)


def test_a_screen_run_past_twice_its_drop_line_is_stopped_there() -> None:
    # A CPU run that passes twice the drop line is stopped there and counts as a screen sample
    # above the line: two in a row past the policy's warm-up (2 runs here) decide (bf16 without
    # bf16 units: a second of a step against a 10 ms line), and the stop says its figure is
    # where they were stopped, a lower bound. Real time: the step sleeps.
    import time

    from advisor.execute.runner import _raced

    calls: list[float] = []

    def step() -> None:
        calls.append(time.perf_counter())
        if len(calls) > 1:  # its first call is not the screen's to bound
            time.sleep(2.0)

    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=7, max_samples=100,
                          target_rel_ci=1e-9, max_time_s=100)  # fmt: skip
    start = time.perf_counter()
    m = measure(step, CPU, policy, race=Race(10.0, screen=3))
    assert time.perf_counter() - start < 1.0 and len(calls) == 5
    assert m.stop == "cut" and len(m.samples_ms) == 2 and 20.0 <= m.median_ms < 1000.0
    stop = _raced(m, Race(10.0, screen=3))
    assert stop is not None and stop.kind == "screened" and stop.cut and stop.samples == 2
    text = Stop(kind="screened", ms=25.0, bar_ms=5.0, samples=2, best_label="default", drop=1.5,
                cut=True).text()  # fmt: skip
    assert text.startswith("screened out: 2 runs in a row past twice the drop line (25.000 ms or")
    assert "5.00x the fastest screen" in text
    # without a screen, or under it, no run is bounded
    short = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=3, max_samples=3,
                         target_rel_ci=1e-9, max_time_s=100)  # fmt: skip
    m = measure(lambda: time.sleep(0.03), CPU, short, race=Race(10.0))
    assert m.stop != "cut" and m.median_ms >= 30.0


def test_a_slow_warm_up_and_one_later_spike_do_not_decide_a_screen() -> None:
    # Three slow runs after the first call (the policy's two, still paying one-time costs, and
    # one more) and one later run past the cut (2 s each here, stopped at 100 ms) are not two
    # in a row past the policy's warm-up: the screen goes on, and its samples (5 ms) keep it in.
    # On a 2-core Xeon one slow run once dropped the fastest candidate (channels_last with
    # bf16, 15 ms steady); on an AMX Xeon the seeds' Conv3d (3 ms steady) runs 8-12 ms for a
    # few runs after its first call, and with them a spike past its 8 ms cut dropped a
    # runner-up. The line is 10x the step, so a busy machine's slower sleeps stay under it.
    import time

    calls: list[float] = []

    def step() -> None:
        calls.append(time.perf_counter())
        time.sleep(2.0 if len(calls) in (2, 3, 4, 6) else 0.005)

    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_samples=7, max_samples=100,
                          target_rel_ci=1e-9, max_time_s=100)  # fmt: skip
    m = measure(step, CPU, policy, race=Race(50.0, screen=3))
    assert m.stop == "screened" and len(m.samples_ms) == 3
    assert not Race(50.0, screen=3).screened_out(m.samples_ms) and m.median_ms < 50.0


def test_a_run_is_cut_only_after_it_has_run_its_line_however_late_it_starts() -> None:
    # Under load the run can start well after the allowance's set-up: the count begins at the
    # run's start, so a cut run has run the cut line of its own (a timer counting from the
    # set-up once cut one at 16 ms for a 20 ms line; and, firing during the set-up, failed the
    # candidate with "cannot access local variable 't'").
    import time

    from advisor.measure.timing import _run

    running: list[bool] = []

    def clock() -> float:
        if not running:  # a read before the run starts, 10 ms late: a busy machine's delay
            time.sleep(0.01)
        return time.perf_counter()

    def run() -> None:
        running.append(True)
        time.sleep(2.0)

    assert 0.020 <= _run(run, 20.0, clock) < 1.0  # cut at its line, not at 10 ms of its own


def test_a_screened_out_verdict_needs_its_median_above_the_limit() -> None:
    race = Race(10.0, screen=3)
    assert not race.screened_out([11.0])  # one of three: not a majority
    assert race.screened_out([11.0, 12.0])  # two of three
    assert not race.screened_out([9.0, 11.0])  # the median not above it
    assert not Race(float("inf"), screen=3).screened_out([1e9, 1e9])
    assert not Race(10.0).screened_out([1e9, 1e9])  # not a screen


class ScriptedEvaluator:
    """Times each candidate with the real sampler on an injected clock: `screen_ms` is a
    candidate's time in its screen (a few early samples), `full_ms` in full timing. Not gated:
    these tests check which candidates screening sends on, not the gate."""

    def __init__(self, screen_ms: dict[str, float], full_ms: dict[str, float]) -> None:
        self.screen_ms, self.full_ms = screen_ms, full_ms
        self.calls: list[tuple[str, bool]] = []
        self.policy = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=5, max_samples=5,
                                   target_rel_ci=1e-9, max_time_s=100)  # fmt: skip

    def __call__(self, settings: Settings, *, race: Race | None = None,
                 time_left_s: float | None = None) -> TrialResult:  # fmt: skip
        screening = race is not None and race.screen is not None
        label = settings.label()
        self.calls.append((label, screening))
        clock = Clock((self.screen_ms if screening else self.full_ms)[label] / 1e3)
        # full timing is timed whole here (no race): these tests check what screening sends on
        m = measure(clock.step, CPU, self.policy, clock=clock, race=race if screening else None)
        stop = Stop(kind="screened", ms=m.median_ms, samples=len(m.samples_ms)) if m.stop else None
        return TrialResult(settings=settings, status="stopped" if stop else "ok", stop=stop,
                           measurement=m, precision="fp32", rel_error=0.0)  # fmt: skip

    def retime(self, results: list[TrialResult], *, time_left_s: float | None = None) -> list:
        return results

    def use(self, workload: object) -> None: ...

    def know(self, checks: list) -> None: ...

    def close(self) -> None: ...


def _plan(tmp_path: Path) -> tuple:
    space = load_space(str(DATA / "grid8_cpu.yaml"), CPU)
    wl = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    options = SearchOptions(mode="infer", storage="memory", screen=True)
    return open_plan(wl, CPU, space, options), options


def test_screening_drops_the_slow_and_times_the_rest_fastest_first(tmp_path: Path) -> None:
    plan, options = _plan(tmp_path)
    labels = [s.label() for s in plan.cands]
    assert len(labels) >= 4
    # the default at 100 ms; one change 2x faster; the rest 2x slower than the default
    screen_ms = {label: 200.0 for label in labels}
    screen_ms["default"], screen_ms[labels[2]] = 100.0, 50.0
    ev = ScriptedEvaluator(screen_ms, screen_ms)
    out = screen(plan, ev, options, deadline=time.perf_counter() + 60, start=time.perf_counter(),
                 contest=Contest())
    assert out is not None and out.best_ms == pytest.approx(50.0)
    assert [c for c, screening in ev.calls if screening] == labels  # every candidate screened
    # the default always survives; the fastest comes next; 4x the fastest does not
    assert [s.label() for s in plan.cands] == ["default", labels[2]]
    assert {s.label() for s in out.dropped} == set(labels) - {"default", labels[2]}


def test_a_search_times_only_the_survivors_in_full(tmp_path: Path) -> None:
    wl = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "grid8_cpu.yaml"), CPU).model_copy(update={"race": True})
    labels = [s.label() for s in _plan(tmp_path)[0].cands]
    screen_ms = {label: 200.0 for label in labels}
    screen_ms["default"], screen_ms[labels[2]] = 100.0, 50.0
    ev = ScriptedEvaluator(screen_ms, screen_ms)
    outcome = search(wl, CPU, space, SearchOptions(mode="infer", storage="memory", screen=True),
                     evaluator=ev)  # fmt: skip
    assert [c for c, screening in ev.calls if not screening] == ["default", labels[2]]
    stopped = [r for r in outcome.results if r.status == "stopped"]
    assert {r.settings.label() for r in stopped} == set(labels) - {"default", labels[2]}
    assert all(r.reason.startswith("screened out") and "4.00x" in r.reason for r in stopped)
    # 4x the default: stopped as soon as their screens' medians were known to be above 1.5x
    assert all(1 <= len(r.measurement.samples_ms) < SCREEN_SAMPLES for r in stopped)
    assert outcome.screen_note is not None and "left 2 candidate(s)" in outcome.screen_note
    # each dropped candidate's label whole, the labels apart (a label holds commas)
    shown = outcome.screen_note.split("the fastest: ", 1)[1].split("; ")
    assert sorted(shown) == sorted(set(labels) - {"default", labels[2]})
    # the guard: a survivor that full timing puts far from its screen sends every candidate
    # on to full timing, and the advice says why
    full_ms = dict(screen_ms, **{labels[2]: 500.0})  # screened fastest, 5x slower in full
    ev = ScriptedEvaluator(screen_ms, full_ms)
    outcome = search(wl, CPU, space, SearchOptions(mode="infer", storage="memory", screen=True),
                     evaluator=ev)  # fmt: skip
    assert sorted(c for c, screening in ev.calls if not screening) == sorted(labels)
    assert not any((r.reason or "").startswith("screened") for r in outcome.results)
    assert outcome.screen_note is not None and "did not hold" in outcome.screen_note


@pytest.mark.parametrize("screening", [False, True])
def test_past_the_budget_only_the_default_is_measured(tmp_path: Path, screening: bool) -> None:
    """A search whose budget is spent before it starts still measures PyTorch's default (the
    baseline), and starts nothing after it: the rest are listed as left out by the budget."""
    wl = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "grid8_cpu.yaml"), CPU).model_copy(update={"race": True})
    labels = [s.label() for s in _plan(tmp_path)[0].cands]
    ms = {label: 100.0 for label in labels}
    ev = ScriptedEvaluator(ms, ms)
    options = SearchOptions(mode="infer", storage="memory", screen=screening,
                            deadline=time.perf_counter())  # fmt: skip
    outcome = search(wl, CPU, space, options, evaluator=ev)
    assert [c for c, screened in ev.calls if not screened] == ["default"]
    assert [r.settings.label() for r in outcome.results] == ["default"]
    assert sorted(outcome.not_measured) == sorted(set(labels) - {"default"})


def test_a_space_that_races_nothing_screens_nothing(tmp_path: Path) -> None:
    # `race: false` promises every candidate measured and gated in full: a screen would drop some
    wl = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "grid8_cpu.yaml"), CPU)
    assert not space.race
    labels = [s.label() for s in _plan(tmp_path)[0].cands]
    ms = {label: 200.0 for label in labels}
    ms["default"] = 100.0
    ev = ScriptedEvaluator(ms, ms)
    outcome = search(wl, CPU, space, SearchOptions(mode="infer", storage="memory", screen=True),
                     evaluator=ev)  # fmt: skip
    assert not any(screening for _, screening in ev.calls)
    assert sorted(c for c, _ in ev.calls) == sorted(labels)
    assert outcome.screen_note is None


def test_the_guard_weighs_the_screens_error_against_the_cut(tmp_path: Path) -> None:
    plan, options = _plan(tmp_path)
    labels = [s.label() for s in plan.cands]
    # the fastest screen 100 ms; the nearest dropped candidate at 160 ms, 1.6x
    screen_ms = {label: 200.0 for label in labels}
    screen_ms.update({"default": 100.0, labels[1]: 110.0, labels[2]: 160.0})
    out = screen(plan, ScriptedEvaluator(screen_ms, {}), options,
                 deadline=time.perf_counter() + 60, start=time.perf_counter(),
                 contest=Contest())  # fmt: skip
    assert out is not None and [s.label() for s in plan.cands] == ["default", labels[1]]

    def full(label: str, ms: float) -> TrialResult:
        s = next(c for c in out.full_plan if c.label() == label)
        return ScriptedEvaluator({}, {label: ms})(s)

    # full timing agrees with the screens: the cut stands
    assert inversion(out, plan, [full("default", 100.0), full(labels[1], 110.0)]) is None
    # a few per cent the other way round (an H200's 2 ms steps): near-equal candidates, whose
    # order full timing settles; the 1.6x cut stands
    assert inversion(out, plan, [full("default", 100.0), full(labels[1], 96.0)]) is None
    # the screen overstated one survivor 1.7x against the other: a candidate dropped at 1.6x
    # may have been as wrong, so the cut does not hold
    why = inversion(out, plan, [full("default", 100.0), full(labels[1], 110.0 / 1.7)])
    assert why is not None and labels[1] in why and "1.70x" in why and "1.60x" in why
    # a raced-out survivor's few samples say nothing of its steady state: not counted
    stopped = full(labels[1], 110.0 / 1.7).model_copy(update={"status": "stopped"})
    assert inversion(out, plan, [full("default", 100.0), stopped]) is None


def test_a_short_step_is_screened_only_where_survivors_are_parked(tmp_path: Path) -> None:
    plan, options = _plan(tmp_path)
    before = list(plan.cands)
    ms = {s.label(): 5.0 for s in plan.cands}
    ms[before[1].label()] = 50.0  # 10x the default's step
    # a launch-bound GPU step: a survivor would be built and warmed up again, a screen cannot pay
    ev = ScriptedEvaluator(ms, ms)
    cuda = min_step_ms(torch.device("cuda"))
    assert cuda == SCREEN_MIN_STEP_MS > 5.0
    assert screen(plan, ev, options, time.perf_counter() + 60, 0.0, Contest(), cuda) is None
    assert plan.cands == before and len(ev.calls) == 1  # the default's screen told it
    # on a CPU a survivor resumes from the park (one re-warming call): every step is screened
    ev = ScriptedEvaluator(ms, ms)
    out = screen(plan, ev, options, time.perf_counter() + 60, 0.0, Contest(), min_step_ms(CPU))
    assert out is not None and [s.label() for s in out.dropped] == [before[1].label()]
    assert len(ev.calls) == len(before) and before[1] not in plan.cands


def test_a_resumed_study_is_not_screened(tmp_path: Path) -> None:
    plan, options = _plan(tmp_path)
    labels = [s.label() for s in plan.cands]
    ms = {label: 100.0 for label in labels}
    first = screen(plan, ScriptedEvaluator(ms, ms), options, time.perf_counter() + 60, 0.0,
                   Contest())
    assert first is not None
    first.dropped = plan.cands[1:2]
    record_dropped(first, plan, Contest())  # the study now holds a result
    assert screen(plan, ScriptedEvaluator(ms, ms), options, time.perf_counter() + 60, 0.0,
                  Contest()) is None


# ---- whole runs ----------------------------------------------------------------------------------


def test_a_quick_run_answers_from_the_global_knobs() -> None:
    advice = advisor.advise(model_file=str(DATA / "tiny_cnn.py"), mode="train", device="cpu",
                            space="cpu", effort="quick", storage="memory")  # fmt: skip
    r = advice.config.result
    assert r is not None and r.effort == "quick" and r.answer == "final"
    assert not any(x.settings.compiled or x.settings.layers for x in advice.results)
    assert {x.settings.conv_impl for x in advice.results} == {"native"}
    assert any("quick effort" in n for n in r.notes)
    assert "compile" not in r.stage_s and "per-layer" not in r.stage_s


def test_the_eager_answer_is_given_before_the_compile_stage() -> None:
    seen: list[advisor.Advice] = []
    stages_then: list[set[str]] = []

    def on_eager(a: advisor.Advice) -> None:
        seen.append(a)
        assert a.config.result is not None
        stages_then.append(set(a.config.result.stage_s))

    from advisor.service import run_advise

    advice = run_advise(model_file=str(DATA / "tiny_cnn.py"), mode="infer", device="cpu",
                        space=str(DATA / "compile_fast_cpu.yaml"), storage="memory",
                        on_eager=on_eager)  # fmt: skip
    assert len(seen) == 1 and seen[0].config.result.answer == "eager"  # type: ignore[union-attr]
    assert not seen[0].settings.compiled
    assert "compile" not in stages_then[0] and "compile" in advice.config.result.stage_s  # type: ignore[union-attr]
    assert advice.config.result.answer == "final"  # type: ignore[union-attr]
    assert any(r.settings.compiled for r in advice.results)


@pytest.mark.slow  # a cold compile to interrupt
@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT: POSIX")
def test_ctrl_c_during_the_compile_stage_keeps_the_eager_answer(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    run = AdviseRun([str(DATA / "tiny_cnn.py"), "--mode", "train", "--device", "cpu", "--space",
                     str(DATA / "compile_fast_cpu.yaml"), "--storage", "memory", "--out",
                     str(out)], tmp_path)  # fmt: skip
    # Ctrl-C comes once the eager answer is printed, which is after it is written
    seen = run.wait_for("Eager answer:")
    assert seen is not None and out.exists(), run.err[-2000:]
    time.sleep(0.2)
    code = run.ctrl_c()
    err = run.err
    why = f"the eager answer at {seen:.1f} s, Ctrl-C 0.2 s later:\n{err[-2500:]}"
    assert code == 130, why
    assert "interrupted during the compile stage" in err and "keeps the eager answer" in err
    assert "Traceback" not in err
    config = json.loads(out.read_text())
    assert config["result"]["answer"] == "eager" and config["settings"]["compile"] == "off"
    assert advisor.Config.model_validate(config).result is not None


# ---- the per-layer stage's groups at default effort -----------------------------------------------


def test_default_effort_measures_the_groups_that_carry_the_conv_work() -> None:
    from dataclasses import dataclass

    from advisor.stages.layer_share import group_flops, main_groups
    from advisor.workload.layer_spec import LayerSpec

    @dataclass(frozen=True)
    class G:
        names: tuple[str, ...]
        spec: LayerSpec

    def conv(cin: int, cout: int, k: int, hw: int, n: int = 1, **kw: object) -> G:
        spec = LayerSpec(kind="Conv2d", in_channels=cin, out_channels=cout, kernel_size=k,
                         input_shape=(8, cin, hw, hw), **kw)  # type: ignore[arg-type]
        return G(tuple(f"l{i}" for i in range(n)), spec)

    big = conv(64, 64, 3, 32)  # 604M FLOPs forward
    mid = conv(32, 64, 1, 64, n=2)  # 134M, twice
    tiny = conv(32, 32, 3, 64, groups=32, padding=1)  # 19M, depthwise
    assert group_flops(mid, "train") == 3 * group_flops(mid, "infer")
    keep, rest = main_groups([tiny, big, mid], "train")
    assert keep == [big, mid] and rest == [tiny]  # 872M of 891M: over 90% without the tiny one
    assert main_groups([tiny, big, mid], "train", share=1.0) == ([tiny, big, mid], [])
    assert main_groups([], "infer") == ([], [])


def test_the_per_layer_stage_leaves_the_minor_groups_native_at_default_effort() -> None:
    from advisor.search.run import make_evaluator
    from advisor.search.storage import open_storage
    from advisor.stages.layer_share import MINOR
    from advisor.stages.per_layer import choose_layer_impls
    from advisor.workload.build import model_workload

    space = load_space(str(DATA / "per_layer_cpu.yaml"), CPU)
    workload = model_workload(str(advisor.__path__[0] + "/examples/small_cnn.py"))
    options = SearchOptions(mode="infer", storage="memory")
    stats: dict[str, int] = {}
    choices = choose_layer_impls(
        workload, Settings(), CPU, "infer", space,
        lambda wl: make_evaluator(wl, CPU, space, options), open_storage("memory"), "x",
        stats=stats, every_group=False,
    )  # fmt: skip
    minor = [c for c in choices if c.why == MINOR]
    measured = [c for c in choices if c.results]
    # small_cnn's depthwise conv holds 2% of its conv FLOPs: left out; the large ones measured
    assert stats["minor"] == len(minor) >= 1 and not any(c.results for c in minor)
    assert all(c.chosen == "native" for c in minor) and len(measured) >= 3
    assert any(c.group.spec.groups == 32 for c in minor)
