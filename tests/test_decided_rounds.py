"""Interleaved rounds stop once their question is decided: the rule looked at after every round
(`interleave(decided=...)`), the final check's "held or failed" and the compiled candidate's
"cannot pay back", each at the strict interval (`stats.STRICT_Z`). Injected samples and an
injected clock: the statistics are exact, and nothing here is a speed claim."""

from __future__ import annotations

from functools import partial

from advisor.config import FinalCheck
from advisor.execute.retime import decided_with_or_without_one_offs, pick_decided, rounds
from advisor.knobs import Settings
from advisor.measure.stats import STRICT_Z, Measurement, paired_speedup
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import DECIDE_AFTER_S, interleave
from advisor.stages.final_check import MIN_ROUNDS, check_decided, holds, runner_up_check


def _samplers(*series: list[float]) -> list:
    """Samplers that return their series in order (the injected measurements)."""
    its = [iter(s) for s in series]
    return [lambda it=it: next(it) for it in its]


class _Clock:
    """A clock that moves 1 ms per reading: the budget is never what stops the rounds."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1e-3
        return self.t


def _order(base: list[float], pick: list[float], runner: list[float]) -> str:
    """What the final check says of the pick and the runner-up from these rounds."""
    check = FinalCheck(where="fresh process", speedup=2.0, speedup_ci=(1.9, 2.1), rounds=len(base),
                       held=True)  # fmt: skip
    ms = [Measurement(samples_ms=s) for s in (base, pick, runner)]
    return runner_up_check(check, Settings(amp="bf16"), ms, None, 0.02).order  # type: ignore[arg-type]


def test_rounds_stop_at_the_first_decided_round_and_never_before_the_minimum() -> None:
    looks: list[int] = []

    def decided(samples: list[list[float]]) -> bool:
        looks.append(len(samples[0]))
        return len(samples[0]) >= 4  # decided from round 4 on

    out = interleave(_samplers([1.0] * 50, [2.0] * 50), _Clock(), min_rounds=7, budget_s=10.0,
                     decided=decided)  # fmt: skip
    assert [len(s) for s in out] == [7, 7]  # decided earlier, but 7 rounds are the least
    assert looks == [7]
    # Never decided: the budget or max_rounds ends them, as without a rule.
    out = interleave(_samplers([1.0] * 50, [2.0] * 50), _Clock(), min_rounds=7, max_rounds=20,
                     budget_s=10.0, decided=lambda s: False)  # fmt: skip
    assert [len(s) for s in out] == [20, 20]


def test_rounds_of_a_short_step_decide_only_once_they_span_the_least_time() -> None:
    # Rounds taken within one disturbance of the machine all agree on it: a rule that holds from
    # the first round stops them only once 10 ms per sampler have passed (the clock moves 1 ms
    # a reading: one at the start, one after each round).
    out = interleave(_samplers([1.0] * 50, [2.0] * 50), _Clock(), min_rounds=5, budget_s=10.0,
                     decided=lambda s: True, decide_after_s=0.01)  # fmt: skip
    assert [len(s) for s in out] == [20, 20]
    # the rounds' policy asks it of every decided re-time, final check and payback
    assert rounds(TimingPolicy())["decide_after_s"] == DECIDE_AFTER_S > 0


def test_the_final_check_is_decided_when_every_early_round_agrees() -> None:
    base = [40.0, 41.0, 39.5, 40.2, 40.8, 39.9, 40.1]
    win = [20.0, 21.0, 19.0, 20.5, 20.2, 19.8, 20.1]  # ~2x in every round
    assert check_decided([base, win])
    assert check_decided([win, base])  # a clear loss is decided too: the check fails
    assert not check_decided([base[: MIN_ROUNDS - 1], win[: MIN_ROUNDS - 1]])
    # One round of seven the other way: at 7 rounds both intervals are the ratios' whole range.
    assert not check_decided([base, [*win[:6], 41.0]])
    # Two of 13 the other way: the usual 95% interval (from the third-lowest ratio) is above
    # 1.0x, the strict one (from the second-lowest) is not: the rounds go on.
    base13, pick13 = base + base[:6], win + win[:4] + [41.0, 41.5]
    assert not check_decided([base13, pick13])
    assert paired_speedup(Measurement(samples_ms=base13), Measurement(samples_ms=pick13))[1] > 1.0
    # A change within noise is never decided, however many rounds.
    flat_base = [40.0 + (i % 5) for i in range(60)]
    flat_pick = [40.0 + ((i + 2) % 5) for i in range(60)]
    assert not check_decided([flat_base, flat_pick])


def test_a_decided_final_check_gives_the_verdict_the_usual_interval_gives() -> None:
    # Every prefix of these rounds where the strict rule decides: the 95% interval reported
    # from the same rounds is inside the strict one and on the same side of 1.0x.
    base = [40.0 + (i * 7 % 5) for i in range(40)]
    pick = [36.0 + (i * 3 % 6) for i in range(40)]
    for n in range(MIN_ROUNDS, 41):
        b, p = Measurement(samples_ms=base[:n]), Measurement(samples_ms=pick[:n])
        _, lo, hi = paired_speedup(b, p)
        _, slo, shi = paired_speedup(b, p, STRICT_Z)
        assert slo <= lo <= hi <= shi
        if check_decided([base[:n], pick[:n]]):
            assert holds((lo, hi), None, 0.02) == holds((slo, shi), None, 0.02)


def test_a_gain_shown_smaller_than_min_gain_does_not_hold() -> None:
    # 0.5% faster in every round: beyond noise, but surely under the 2% the search asked for
    # (CI 2026-11-27: a fresh-process tie read 1.001x [1.0002, 1.006] and counted as held).
    base = [40.0 + 0.1 * (i % 3) for i in range(9)]
    pick = [b / 1.005 for b in base]
    _, lo, hi = paired_speedup(Measurement(samples_ms=base), Measurement(samples_ms=pick))
    assert lo > 1.0 and hi < 1.02
    assert not holds((lo, hi), None, 0.02) and check_decided([base, pick])
    assert holds((lo, hi), None, 0.004)  # with a smaller min_gain it would be worth it
    assert holds((1.1, 1.3), None, 0.02) and not holds((1.1, 1.3), (0.9, 0.95, 1.0), 0.02)


def test_a_runner_up_is_decided_only_once_it_and_the_pick_are_ordered() -> None:
    base = [40.0 + (i % 3) for i in range(30)]
    pick = [20.0 + (i % 2) * 0.4 for i in range(30)]  # ~2x the default's speed
    faster = [x / 1.1 for x in pick]  # 10% faster than the pick in every round
    same = [20.2 - (i % 2) * 0.4 for i in range(30)]  # within noise of the pick
    assert check_decided([base[:7], pick[:7], faster[:7]])
    assert _order(base[:7], pick[:7], faster[:7]) == "runner-up"  # recommended in its place
    assert check_decided([base[:7], pick[:7], [x * 1.1 for x in pick[:7]]])  # the pick is faster
    assert not check_decided([base, pick, same])  # never, however many rounds: within noise
    # 1% faster than the pick in every round: it cannot beat the pick by min_gain, so no more
    # rounds can make it the recommendation: decided, and the check cannot order the two
    one = [x / 1.01 for x in pick]
    assert check_decided([base[:7], pick[:7], one[:7]], min_gain=0.02)
    assert _order(base[:7], pick[:7], one[:7]) == "undecided"
    # The seeds' Conv3d: runners-up 0.5-3% slower than the pick in every round took all 200
    # rounds while the strict interval had to lie wholly beyond min_gain; the pick stays from
    # the first rounds on, and the check says which it beat
    for by in (1.005, 1.015, 1.025):
        slower = [x * (by + 0.005 * (i % 2)) for i, x in enumerate(pick)]
        assert check_decided([base[:7], pick[:7], slower[:7]])
        assert _order(base[:7], pick[:7], slower[:7]) == ("pick" if by > 1.02 else "undecided")
    # The pick decided against the default, the runner-up not (it is as slow as the default).
    assert not check_decided([base, pick, [*base[1:], base[0]]])


def test_a_re_time_is_decided_once_its_leader_is_clear_and_never_on_a_tie() -> None:
    base = [40.0, 41.0, 39.5, 40.2, 40.8, 39.9, 40.1]
    win = [20.0, 21.0, 19.0, 20.5, 20.2, 19.8, 20.1]
    mid = [30.0, 30.5, 29.8, 30.2, 30.1, 29.9, 30.3]
    same = [0, 1, 1]  # the default, then two one-change candidates
    assert pick_decided([base, win, mid], same, 0.02)  # win leads both by far more than 2%
    assert pick_decided([win, base], [1, 0], 0.02)  # whichever place the leader has
    assert not pick_decided([base[:4], win[:4]], [0, 1], 0.02)  # too few rounds for an interval
    # the two fastest within 1% of each other and as simple: a tie is never decided, the budget
    # ends it
    assert not pick_decided([base, win, [w * 1.01 for w in win]], same, 0.02)
    out = interleave(_samplers(base * 5, win * 5, mid * 5), _Clock(), min_rounds=5, budget_s=10.0,
                     decided=partial(pick_decided, complexity=same, min_gain=0.02))  # fmt: skip
    assert [len(s) for s in out] == [5, 5, 5]  # decided at the fewest rounds


def test_a_more_complex_finalist_that_cannot_beat_the_simpler_pick_decides_the_re_time() -> None:
    # small_cnn train: channels_last + bf16 (two changes) against the same with one layer
    # swapped (three), 1-4% slower in every round: no more rounds can make the swap the pick.
    base = [36.0 + (i % 3) * 0.3 for i in range(7)]
    pick = [16.7 + (i % 2) * 0.2 for i in range(7)]
    combo = [p * (1.01 + 0.01 * (i % 4)) for i, p in enumerate(pick)]
    assert pick_decided([base, pick, combo], [0, 2, 3], 0.02)
    # ...but where the swap is the simpler one, the 1-4% must be shown beyond min_gain first
    assert not pick_decided([base, pick, combo], [0, 3, 2], 0.02)
    # a more complex finalist 1% faster than the pick in every round cannot beat it by 2%...
    faster = [p / 1.01 for p in pick]
    assert pick_decided([base, pick, faster], [0, 2, 3], 0.02)
    # ...one 3% faster might: it is the pick once it beats the simpler one beyond min_gain
    faster = [p / 1.03 for p in pick]
    assert pick_decided([base, pick, faster], [0, 2, 3], 0.02)
    wobbly = [p / (1.03 if i % 2 else 0.99) for i, p in enumerate(pick)]
    assert not pick_decided([base, pick, wobbly], [0, 2, 3], 0.02)
    # the default is the pick where no change can beat it by min_gain
    flat = [b / 1.005 for b in base]
    assert pick_decided([base, flat], [0, 1], 0.02)


def test_a_compiled_leader_decides_a_re_time_only_once_the_eager_pick_is_decided_too() -> None:
    # The compile may not pay back (its bill comes after the re-time): the eager finalists'
    # order must then be known from the same rounds.
    base = [20.0 + (i % 3) * 0.3 for i in range(7)]
    close = [b / (1.06 if i % 2 else 0.99) for i, b in enumerate(base)]  # eager: 1-6% faster
    compiled = [b / 2 for b in base]  # compiled, far ahead of both
    samples, changes = [base, close, compiled], [0, 1, 2]
    assert pick_decided(samples, changes, 0.02)
    assert not decided_with_or_without_one_offs(samples, changes, subsets=([0, 1],), min_gain=0.02)
    clear = [b / 1.5 for b in base]  # an eager pick 1.5x faster than the default in every round
    samples = [base, clear, compiled]
    assert decided_with_or_without_one_offs(samples, changes, subsets=([0, 1],), min_gain=0.02)
    # without a compiled finalist it is pick_decided itself
    alone = decided_with_or_without_one_offs([base, close], [0, 1], ([0, 1],), min_gain=0.02)
    assert alone == pick_decided([base, close], [0, 1], 0.02)


def test_a_cudnn_benchmark_twin_decides_only_once_the_pick_without_it_is_decided_too() -> None:
    """cuDNN's search is billed as a compile is (`compile_bill.paying`): a twin far ahead may
    still not pay, and the pick is then the plain finalists', whose order the rounds must give."""
    from advisor.execute.retime import stop_rule
    from advisor.measure.results import TrialResult

    cl = Settings(memory_format="channels_last")
    twin_of_cl = cl.model_copy(update={"cudnn_benchmark": True})
    finalists = [TrialResult(settings=s, status="ok", precision="fp32")
                 for s in (Settings(), cl, twin_of_cl)]  # fmt: skip
    rule = stop_rule(finalists, 0.02)
    base = [20.0 + (i % 3) * 0.3 for i in range(7)]
    close = [b / (1.06 if i % 2 else 0.99) for i, b in enumerate(base)]  # 1-6% faster
    twin = [b / 2 for b in base]
    assert pick_decided([base, close, twin], [0, 1, 2], 0.02)  # the twin alone is decided
    assert not rule([base, close, twin])
    assert rule([base, [b / 1.5 for b in base], twin])
