"""The pick: beyond noise, an interval above 1.0x, and among the re-timed finalists only."""

from __future__ import annotations

import random

import pytest

from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement, clearly_faster, paired_speedup, speedup
from advisor.search.pick import choose, decide


def _r(settings: Settings, samples: list[float], retimed: bool = False) -> TrialResult:
    return TrialResult(
        settings=settings,
        status="ok",
        measurement=Measurement(samples_ms=samples),
        retimed=retimed,
    )


def _noisy(center: float, spread: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_a_change_whose_speedup_interval_includes_one_is_not_recommended() -> None:
    # Like the 3-block MobileNet case: 1.07x, significant by Mann-Whitney, but the interval from
    # the two medians' CIs reaches below 1.0x.
    base = _r(Settings(), _noisy(10.0, 0.1, 30, 1))
    layers = _r(Settings(layers={"0": "unfold_gemm"}), _noisy(9.3, 0.1, 30, 2))
    ratio, lo, hi = speedup(base.measurement, layers.measurement)
    assert ratio > 1.02 and lo <= 1.0 < hi
    assert clearly_faster(layers.measurement, base.measurement)  # the old rule would take it
    pick = choose([base, layers], base)
    assert pick.chosen is base
    assert "includes 1.0x" in pick.text() and "not recommended" in pick.text()


def test_a_clear_win_is_still_recommended() -> None:
    base = _r(Settings(), _noisy(10.0, 0.02, 30, 3))
    cl = _r(Settings(memory_format="channels_last"), _noisy(6.0, 0.02, 30, 4))
    pick = choose([base, cl], base)
    assert pick.chosen is cl
    assert speedup(base.measurement, cl.measurement)[1] > 1.0


def test_an_unsure_fastest_does_not_hide_a_sure_win() -> None:
    base = _r(Settings(), _noisy(10.0, 0.02, 30, 5))
    sure = _r(Settings(memory_format="channels_last"), _noisy(7.0, 0.02, 30, 6))
    wild = _r(Settings(amp="bf16"), [2.0] * 5 + [30.0] * 4)  # fastest median, huge spread
    pick = choose([base, sure, wild], base)
    assert pick.chosen is sure
    assert "amp=bf16" in pick.text() and "includes 1.0x" in pick.text()


def test_the_final_pick_is_made_among_the_re_timed_finalists_only() -> None:
    base = _r(Settings(), _noisy(10.0, 0.02, 30, 7), retimed=True)
    cl = _r(Settings(memory_format="channels_last"), _noisy(8.0, 0.02, 30, 8), retimed=True)
    # measured alone, on a quieter moment of the machine: looks fastest, was never re-timed
    stale = _r(Settings(amp="bf16"), _noisy(5.0, 0.02, 30, 9))
    assert choose([base, cl, stale], base).chosen is stale
    assert decide([base, cl, stale], base, Contest()).chosen is cl
    # without a re-time, every measured candidate competes
    plain = [r.model_copy(update={"retimed": False}) for r in (base, cl)]
    assert decide([*plain, stale], plain[0], Contest()).chosen is stale


def _drifting(n: int, seed: int) -> list[float]:
    """A step time that wanders from round to round (load, clocks): 8-14 ms."""
    rng = random.Random(seed)
    return [10.0 * (1 + 0.4 * rng.random()) * (0.8 + 0.2 * (i % 3)) for i in range(n)]


def test_finalists_retimed_together_are_compared_round_by_round() -> None:
    """A steady 6% win under drift: the unpaired interval (two CIs' opposite ends) spans 1.0x,
    the per-round ratios do not. Re-timed together, it is recommended; the same samples from
    separate trials are not."""
    drift = _drifting(40, 3)
    rng = random.Random(4)
    faster = [x / 1.06 * (1 + rng.uniform(-0.01, 0.01)) for x in drift]
    base, cl = Settings(), Settings(memory_format="channels_last")
    for retimed, expected in ((True, cl), (False, base)):
        b, c = _r(base, drift, retimed), _r(cl, faster, retimed)
        lo_unpaired = speedup(b.measurement, c.measurement)[1]
        assert lo_unpaired < 1.0
        pick = decide([b, c], b, Contest())
        assert pick.chosen.settings == expected, pick.why
    ratio, lo, hi = paired_speedup(b.measurement, c.measurement)
    assert 1.04 < lo < ratio < hi < 1.08 and ratio == pytest.approx(1.06, abs=0.01)


def test_no_difference_stays_no_difference_when_paired() -> None:
    """Paired, a change that is as fast as the default is not recommended: its per-round ratios
    straddle 1.0x; and a 1% win stays under `min_gain`."""
    drift = _drifting(40, 5)
    rng = random.Random(6)
    for gain in (1.0, 1.01):
        same = [x / gain * (1 + rng.uniform(-0.03, 0.03)) for x in drift]
        b, c = _r(Settings(), drift, True), _r(Settings(memory_format="channels_last"), same, True)
        assert decide([b, c], b, Contest()).chosen is b
    with pytest.raises(ValueError):
        paired_speedup(Measurement(samples_ms=drift), Measurement(samples_ms=drift[:10]))
