"""The training check's look on held-out batches (advisor/gate/held_out.py): a precision that
trails fp32 only near the floor of memorising the check's four batches, and ends where fp32 does
on batches of the task it never trained on, trains like fp32 (bf16 on ResNet-50 at 32 x 224² on
an H200 was rejected so); a precision that cannot carry the model's signal is still rejected
there, and a model whose held-out loss barely moves cannot tell, so the look accepts nothing."""

from __future__ import annotations

import math

import pytest
import torch

from advisor.device.environment import cpu_has_bf16_units
from advisor.gate.held_out import HeldOut
from advisor.gate.precision import check_precision
from advisor.knobs import Settings
from advisor.measure.verdict import PrecisionCheck, PrecisionCheckSettings
from advisor.workload.args import make_workload
from tests.conftest import DATA

CPU = torch.device("cpu")
BF16 = Settings(amp="bf16")


def test_the_look_judges_only_where_a_precision_that_learnt_nothing_would_be_far_outside() -> None:
    # fp32 learnt 40% of the held-out start; the allowance is 1.5 x a band of 0.2%: 0.3%.
    look = HeldOut(gap=0.002, band=0.002, learnt=0.40, allowance=0.003, signal=4.0)
    assert look.tells and look.accepts
    assert not HeldOut(0.004, 0.002, 0.40, 0.003, 4.0).accepts  # behind by more than allowed
    assert HeldOut(-0.05, 0.002, 0.40, 0.003, 4.0).accepts  # ahead
    assert not HeldOut(math.inf, 0.002, 0.40, 0.003, 4.0).accepts  # diverged
    # fp32 learnt only 1% there: a precision that learnt nothing would be 1% behind, within
    # 4 x the allowance: the look cannot tell, so it accepts nothing.
    blind = HeldOut(gap=0.0, band=0.002, learnt=0.01, allowance=0.003, signal=4.0)
    assert not blind.tells and not blind.accepts
    assert not HeldOut(0.0, 0.0, 0.0, 0.0, 4.0).tells  # nothing learnt, nothing allowed


def test_a_signal_below_bf16s_resolution_is_outside_on_held_out_batches_too() -> None:
    workload = make_workload(model_file=str(DATA / "below_bf16.py"))
    check = check_precision(workload, BF16, "bf16", CPU, "train", PrecisionCheckSettings())
    assert not check.accepted and check.judged, check.summary
    held = check.held_out
    assert held is not None, check.summary
    assert held["learnt"] > 0.25  # the task generalises: the look can tell
    assert held["gap"] > 10 * held["allowance"]  # far outside, not a close call
    assert "on held-out batches" in check.summary and ": outside" in check.summary


@pytest.mark.slow  # one to four bf16 checks of a 53-conv network at 32 x 64² (40-50 s each, 2 cores)
def test_bf16_trailing_at_memorisations_floor_trains_like_fp32_on_held_out_batches() -> None:
    """deep_bottleneck_resnet (ResNet-50's depth) learns the check's batches to 17% of the start
    in 16 steps; bf16's trained weights end outside both allowances on them, which rejected bf16
    before the look.

    Whether a draw ends outside there depends on the CPU's bf16 path: seed 0 did on a Zen 4 and
    a Xeon with bf16 units, and ended within on a Zen 2 and a Zen 3 without them (0.75% behind,
    under the 0.81% floor; a bf16 conv there is emulated), where seed 1 ended 4.6% behind. So the
    draw is the first of a few that ends outside on the training batches, tried first where it
    did on this kind of CPU (a draw costs 30-50 s here); bf16 is accepted at every draw."""
    workload = make_workload(model_file=str(DATA / "deep_bottleneck_resnet.py"))
    cfg = PrecisionCheckSettings()

    def outside(c: PrecisionCheck) -> bool:
        return c.gap > c.floor and c.gap > cfg.band_factor * c.band

    first = 0 if cpu_has_bf16_units() else 1
    for seed in (first, *(s for s in range(4) if s != first)):
        check = check_precision(workload, BF16, "bf16", CPU, "train", cfg, seed=seed)
        assert check.accepted and check.judged, check.summary
        if outside(check):
            break
    assert outside(check), "no draw ended outside on the training batches"
    assert check.steps == cfg.steps  # judged at the first horizon: no longer runs were needed
    held = check.held_out
    assert held is not None and held["gap"] <= held["allowance"], check.summary
    assert held["learnt"] >= cfg.held_signal * held["allowance"]
    assert "on held-out batches" in check.summary and ": within" in check.summary

    # The verdict says both: outside on the training batches (which alone rejected it before
    # the look, as on the H200), within on held-out ones.
    assert "on its training batches" in check.summary and "over 0.01 x" in check.summary


def test_the_fp32_runs_keep_the_weights_the_look_needs_and_no_others() -> None:
    """The reference's and the band's trained weights stay with the fp32 runs a second precision
    reuses; a rate fp32 did not learn at keeps none (each is a model's worth of memory)."""
    workload = make_workload(model_file=str(DATA / "below_bf16.py"))
    cache: dict = {}
    cfg = PrecisionCheckSettings()
    bf16 = check_precision(workload, BF16, "bf16", CPU, "train", cfg, fp32_cache=cache)
    (fp32,) = cache.values()
    assert fp32.banded and set(fp32.weights) == {"fp32", "fp32 other batches 1"}
    assert set(fp32.probe_weights) == {fp32.cfg.lr}
    model = workload.make_model()
    for weights in fp32.weights.values():
        assert weights.keys() == model.state_dict().keys()
        assert all(w.device.type == "cpu" for w in weights.values())
    # fp16 reuses those runs (on this model it ends about 5% behind on both kinds of batches):
    # its look compares it with the same fp32 weights on the same held-out batches
    fp16 = check_precision(workload, Settings(amp="fp16"), "fp16", CPU, "train", cfg,
                           fp32_cache=cache)  # fmt: skip
    assert cache[next(iter(cache))] is fp32
    assert bf16.held_out is not None and fp16.held_out is not None, fp16.summary
    assert fp16.held_out["learnt"] == bf16.held_out["learnt"]
    assert fp16.held_out["band"] == bf16.held_out["band"]
    assert 0 < fp16.held_out["gap"] < bf16.held_out["gap"]  # 11 bits carry more of it than 8
