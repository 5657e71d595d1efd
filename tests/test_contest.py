"""The one rule for "can this candidate still win?" (advisor/measure/contest.py): its decisions
are typed `Stop`s read by kind, on injected measurements (exact statistics, no speed claims)."""

from __future__ import annotations

import itertools
from functools import partial

import pytest

from advisor.knobs import Settings
from advisor.measure.contest import HORIZON_STEPS, Contest, break_even
from advisor.measure.results import TrialResult
from advisor.measure.stats import STRICT_Z, Measurement, median_ci
from advisor.measure.stop import Stop
from advisor.measure.timing import interleave
from advisor.space import SearchSpace
from tests.test_decided_rounds import _Clock, _samplers

CL = Settings(memory_format="channels_last")


def _m(*samples: float) -> Measurement:
    return Measurement(samples_ms=list(samples))


def _r(settings: Settings, ms: float, status: str = "ok", spread: tuple[float, ...] = (1.0,)) -> TrialResult:
    samples = [ms * f for f in spread] * (5 if len(spread) == 1 else 1)
    return TrialResult(settings=settings, status=status,  # type: ignore[arg-type]
                       measurement=Measurement(samples_ms=samples))  # fmt: skip


def test_the_space_sets_the_rules_margins_and_the_horizon() -> None:
    space = SearchSpace(name="s", knobs={}, min_gain=0.05, race_margin=1.2, compile_max_gain=1.6)
    c = space.contest(steps=500)
    assert (c.min_gain, c.race_margin, c.compile_max_gain, c.horizon_steps) == (0.05, 1.2, 1.6, 500)
    assert space.contest().horizon_steps == HORIZON_STEPS and space.contest().steps is None
    assert not SearchSpace(name="s", knobs={}, race=False).contest().racing


def test_a_race_stops_beyond_the_bar_times_the_margin_and_gates_below_the_fastest_bar() -> None:
    c = Contest(min_gain=0.02, race_margin=1.5)
    leader, fastest = _m(9.0, 10.0, 11.0), _m(7.0, 8.0, 9.0)
    race = c.race(leader, fastest)
    assert race is not None
    assert race.limit_ms == pytest.approx(11.0 * 1.02 * 1.5)
    assert race.bar_ms == pytest.approx(9.0 * 1.02)  # the fastest, pending or not, sets the bar
    assert race.rival is None and race.horizon_steps is None
    assert c.race(None) is None  # nothing to race yet
    assert Contest(racing=False).race(leader) is None
    paying = c.race(leader, rival=CL.model_dump_json(), pays=True)
    assert paying is not None and paying.horizon_steps == HORIZON_STEPS and paying.rival


def test_a_candidate_could_win_while_its_interval_reaches_below_the_leader_s_bar() -> None:
    c = Contest(min_gain=0.02)
    leader = _m(9.0, 10.0, 11.0)  # its bar: 11.0 * 1.02 = 11.22 ms
    assert c.could_win(_m(10.0, 11.0, 12.0), leader)  # reaches below the bar
    assert c.could_win(_m(11.2, 13.0, 14.0), leader)
    assert not c.could_win(_m(11.3, 13.0, 14.0), leader)  # wholly above it


def test_finalists_are_the_fastest_that_could_win_plus_the_baseline() -> None:
    c = Contest()
    base = _r(Settings(), 10.0)
    rs = [base, _r(Settings(amp="bf16"), 5.0), _r(CL, 7.0),
          _r(Settings(amp="bf16", memory_format="channels_last"), 1.0, "rejected"),
          _r(Settings(conv_impl="unfold_gemm"), 9.0)]  # fmt: skip
    # constant samples: only the fastest could win; the baseline always takes part
    assert [r.median_ms for r in c.finalists(rs, base, top=2)] == [5.0, 10.0]
    wide = [_r(r.settings, r.median_ms, r.status, (0.5, 1.0, 1.5)) for r in rs]
    assert [r.median_ms for r in c.finalists(wide, wide[0], top=2)] == [5.0, 7.0, 10.0]
    assert c.finalists(wide, wide[0], top=5)[-1] is wide[0]  # not added twice


def test_a_compiled_finalist_is_re_timed_with_the_fastest_eager_candidate() -> None:
    # MobileNetV3-Small infer: the compiled twin (6.55 ms) left the per-layer pick (6.93 ms)
    # out of the finalists, and its bill then compared the two across time windows.
    c = Contest()
    base = _r(Settings(), 9.3)
    pick = _r(CL.model_copy(update={"layers": {"0": "unfold_gemm"}}), 6.93)
    compiled = _r(CL.model_copy(update={"compile": "default"}), 6.55)
    assert c.finalists([base, pick, compiled], base, top=3) == [compiled, pick, base]
    assert c.finalists([base, pick], base, top=3) == [pick, base]


def test_a_compile_that_saves_a_millisecond_cannot_pay_a_minute_back() -> None:
    # MobileNetV3-Small train, 2-core CPU: compiled 25.1 ms beside its eager rival at 28.1 ms,
    # cold compile 65.3 s: at most ~3-5 ms a step, paid after 13,000+ steps: beyond 10,000.
    compiled = _m(25.0, 25.1, 25.1, 25.2, 25.3, 25.0, 25.1, 25.2)
    rival = _m(28.0, 28.1, 28.1, 28.2, 28.0, 28.3, 28.1, 28.1)
    stop = Contest().payback(compiled, rival, 65.3, 0.3, "memory_format=channels_last")
    assert stop is not None and stop.kind == "cannot_pay" and stop.horizon_steps == 10_000
    saving = rival.ci_high_ms - compiled.ci_low_ms
    text = stop.text()
    assert "within 10,000 steps" in text and "memory_format=channels_last" in text
    assert f"at most {saving:.3f} ms a step" in text and "65.3 s" in text
    # the same figures with a horizon long enough for them: it may pay, so it goes on
    steps = int((65.3 - 0.3) * 1e3 / saving) + 1
    assert Contest(steps=steps).payback(compiled, rival, 65.3, 0.3, "x") is None
    assert Contest(steps=steps - 2).payback(compiled, rival, 65.3, 0.3, "x") is not None


def test_the_payback_bound_is_the_most_favourable_end_of_both_intervals() -> None:
    compiled = _m(10.0, 12.0, 11.0, 9.0, 13.0, 11.0, 10.0)
    rival = _m(12.0, 14.0, 11.0, 13.0, 15.0, 12.0, 12.0)
    gap = rival.ci_high_ms - compiled.ci_low_ms
    assert gap > rival.median_ms - compiled.median_ms
    assert Contest(steps=int(10e3 / gap) + 1).payback(compiled, rival, 10.0, 0.0, "x") is None
    slower = Contest(steps=10**9).payback(_m(20.0, 20.5, 21.0, 20.2, 20.1), rival, 0.5, 0.0, "x")
    assert slower is not None and "saves nothing per step" in slower.text()


def test_cannot_pay_at_the_strict_interval_implies_it_at_the_usual_one() -> None:
    compiled = [19.0 + ((i * 37) % 11) / 10 for i in range(60)]
    rival = [19.3 + ((i * 53) % 13) / 10 for i in range(60)]
    c = Contest()
    for overhead_s, n in itertools.product((1.0, 3.0, 6.7), range(7, 61)):
        s, r = compiled[:n], rival[:n]
        assert median_ci(sorted(r), STRICT_Z)[1] >= median_ci(sorted(r))[1]
        if c.payback_decided(overhead_s, [s, r]):
            verdict = c.payback(Measurement(samples_ms=s), Measurement(samples_ms=r),
                                cold_s=overhead_s, rival_first_s=0.0, rival_label="x")  # fmt: skip
            assert verdict is not None


def test_payback_rounds_stop_once_they_show_the_compile_cannot_pay() -> None:
    # small_cnn train, 2-core EPYC: compiled 19.39 ms beside its eager twin's 18.99 ms, a 6.7 s
    # cold compile over 10,000 steps would need 0.67 ms a step
    c = Contest()
    compiled = [19.4, 19.3, 19.5, 19.4, 19.2, 19.6, 19.4, 19.3, 19.4, 19.5] * 5
    rival = [19.0, 18.9, 19.1, 19.0, 18.8, 19.2, 19.0, 18.9, 19.0, 19.1] * 5
    rule = partial(c.payback_decided, 6.7)
    out = interleave(_samplers(compiled, rival), _Clock(), min_rounds=7, budget_s=10.0,
                     decided=rule)  # fmt: skip
    assert len(out[0]) == 7
    stop = c.payback(Measurement(samples_ms=out[0]), Measurement(samples_ms=out[1]), 6.9, 0.2, "x")
    assert stop is not None and stop.kind == "cannot_pay"
    # one that may pay (4 ms a step: 6.7 s in ~1,700 steps) gets the full rounds
    fast = [15.0, 15.2, 14.9, 15.1] * 20
    slow = [19.0, 19.1, 18.9, 19.2] * 20
    out = interleave(_samplers(fast, slow), _Clock(), min_rounds=7, max_rounds=40,
                     budget_s=10.0, decided=rule)  # fmt: skip
    assert len(out[0]) == 40 and not rule(out)


def test_break_even_and_what_pays_within_the_horizon() -> None:
    assert break_even(3.0, 1.0) == 3_000 and break_even(3.0, 0.0) == float("inf")
    assert break_even(-1.0, 2.0) == 0
    c = Contest(steps=3_000)
    assert c.pays(3.0, 1.0) and not c.pays(3.001, 1.0) and not c.pays(0.0, 0.0)


def test_a_compile_out_of_reach_and_the_longest_compile_that_could_still_pay() -> None:
    c = Contest(compile_max_gain=1.6, steps=10_000)
    leader = _m(9.0, 10.0, 11.0)
    assert not c.compile_out_of_reach(_m(16.0, 17.0, 17.6), leader)  # 17.6 = 1.6 x 11: in reach
    assert c.compile_out_of_reach(_m(17.7, 18.0, 19.0), leader)
    assert not Contest().compile_out_of_reach(_m(100.0), leader)  # no bound set
    # at 1.6x a 16 ms step saves at most 6 ms: 60 s over 10,000 steps
    assert c.compile_allowance_s(16.0) == pytest.approx(60.0)
    assert Contest().compile_allowance_s(16.0) is None


def test_autotuning_pays_only_where_the_groups_native_time_over_the_horizon_exceeds_it() -> None:
    c = Contest(steps=10_000)
    # 0.05 ms a step over 10,000 steps is 0.5 s: a 3 s autotuning cannot pay even at zero time
    assert c.autotune_cannot_pay(3_000.0, 0.05, layers=1)
    assert c.autotune_cannot_pay(3_000.0, 0.05, layers=4)
    assert not c.autotune_cannot_pay(3_000.0, 0.05, layers=10)
    assert not Contest(steps=100_000).autotune_cannot_pay(3_000.0, 0.05, layers=1)


def test_a_screen_drops_above_its_line_and_its_race_takes_a_few_samples() -> None:
    c = Contest()
    race = c.screen(10.0)
    assert race.limit_ms == pytest.approx(15.0) and race.screen == 3 and race.bar_ms is None
    assert c.screened_out(15.1, 10.0) and not c.screened_out(15.0, 10.0)
    stop = Stop(kind="screened", ms=20.0, bar_ms=10.0, samples=3, best_label="x", drop=1.5)
    assert "2.00x the fastest screen (x, 10.000 ms), above 1.5x" in stop.text()
