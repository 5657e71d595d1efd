"""Whether a half precision is acceptable is decided by what it does to training (advisor/
precision_check.py): a healthy model trains like fp32 in bf16 and fp16; two negative controls do
not (a signal below bf16's resolution; fp16 activations past 65504). Each over 5 input draws."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import advisor
from advisor.gate import numeric as gate_module
from advisor.gate import training
from advisor.gate.precision import check_precision
from advisor.knobs import Settings
from advisor.measure.verdict import PrecisionCheck, PrecisionCheckSettings
from advisor.workload.args import make_workload
from tests.conftest import DATA

CPU = torch.device("cpu")
# Fewer steps than the spaces (32 on 4 batches) keep the suite quick; the rule is the same.
CFG = PrecisionCheckSettings(steps=12, batches=2)
DRAWS = range(5)


def _verdicts(model: str, amp: str, mode: str = "train") -> list:  # noqa: ANN202
    workload = make_workload(model_file=str(DATA / model))
    return [check_precision(workload, Settings(amp=amp), amp, CPU, mode, CFG, seed=draw)  # type: ignore[arg-type]
            for draw in DRAWS]  # fmt: skip


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_a_healthy_model_trains_like_fp32(amp: str) -> None:
    checks = _verdicts("tiny_cnn.py", amp)
    assert all(c.accepted for c in checks), [c.summary for c in checks]
    assert all("trains like fp32" in c.summary for c in checks)
    for c in checks:
        ref = c.losses["fp32"]
        assert ref[-1] < 0.8 * ref[0]  # the task is learnt: the check has something to compare


def test_a_signal_below_bf16s_resolution_is_rejected() -> None:
    checks = _verdicts("below_bf16.py", "bf16")
    assert not any(c.accepted for c in checks), [c.summary for c in checks]
    assert all("does not train like fp32" in c.summary for c in checks)
    assert all(c.gap > 5 * c.band for c in checks)  # far outside the band, not a close call


def test_fp16_activations_past_its_range_are_rejected() -> None:
    checks = _verdicts("fp16_overflow.py", "fp16")
    assert not any(c.accepted for c in checks), [c.summary for c in checks]
    assert all("Inf or NaN" in c.summary for c in checks)
    # The same model in bf16 (fp32's range) trains like fp32: the rule rejects the overflow,
    # not the model.
    assert all(c.accepted for c in _verdicts("fp16_overflow.py", "bf16"))


def test_in_infer_mode_the_outputs_information_decides() -> None:
    assert all(c.accepted for c in _verdicts("tiny_cnn.py", "bf16", "infer"))
    assert not any(c.accepted for c in _verdicts("below_bf16.py", "bf16", "infer"))
    assert not any(c.accepted for c in _verdicts("fp16_overflow.py", "fp16", "infer"))


def test_a_second_precision_reuses_the_fp32_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 autocast, then fp16 (a CPU without bf16 units has no other second precision): the
    fp32 side (reference, other batches) is trained once per model, and each verdict is
    the one a check of its own would give."""
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    trained: list[Settings] = []
    real = training.train

    def counted(wl, settings, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        trained.append(settings)
        return real(wl, settings, *args, **kwargs)

    monkeypatch.setattr(training, "train", counted)
    cache: dict = {}
    first = check_precision(workload, Settings(amp="bf16"), "bf16", CPU, "train", CFG,
                            fp32_cache=cache)  # fmt: skip
    fp32_side = [s for s in trained if s == training.REFERENCE]
    assert len(fp32_side) >= 2 and len(cache) == 1  # reference, other batches
    trained.clear()
    second = check_precision(workload, Settings(amp="fp16"), "fp16", CPU, "train", CFG,
                             fp32_cache=cache)  # fmt: skip
    assert trained == [Settings(amp="fp16")]  # one training run: the precision's own
    alone = check_precision(workload, Settings(amp="fp16"), "fp16", CPU, "train", CFG)
    assert second.accepted == alone.accepted and first.accepted
    assert second.band == pytest.approx(alone.band, rel=1e-3)
    assert second.losses["fp32"] == pytest.approx(alone.losses["fp32"], rel=1e-4)
    assert second.gap == pytest.approx(alone.gap, rel=1e-2, abs=1e-4)


def test_an_unsteady_learning_rate_is_given_up_early_and_all_runs_share_the_one_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At lr 100 and 10 fp32 itself blows up on tiny_cnn: each probe stops at its first unsteady
    pass, and the check runs at the last rate tried (lr 1), the precision included."""
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    steps: dict[float, int] = {}
    current: list[float] = []
    real_train, real_loss = training.train, training.loss_of

    def train(wl, settings, device, batches, targets, cfg, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        current[:] = [cfg.lr]
        return real_train(wl, settings, device, batches, targets, cfg, *args, **kwargs)

    def loss(outs, targets):  # noqa: ANN001, ANN202 - counted per learning rate
        if torch.is_grad_enabled():  # a training step, not the final evaluation
            steps[current[0]] = steps.get(current[0], 0) + 1
        return real_loss(outs, targets)

    monkeypatch.setattr(training, "train", train)
    monkeypatch.setattr(training, "loss_of", loss)
    cfg = PrecisionCheckSettings(steps=12, batches=2, lr=100.0)
    check = check_precision(workload, Settings(amp="bf16"), "bf16", CPU, "train", cfg)
    assert "at lr 1," in check.summary
    assert 0 < steps[100.0] < 12 and 0 < steps[10.0] < 12  # given up before the end
    assert steps[1.0] == 3 * 12  # reference, other batches, bf16: all at lr 1
    assert all(len(run) == 13 for run in check.losses.values())


def test_the_band_runs_are_the_ones_asked_for() -> None:
    """By default the band is fp32 on other batches (the mini-batch noise); `jitter_runs` and
    `batch_runs` add draws, each a run of its own in the check's record."""
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    plain = check_precision(workload, Settings(amp="bf16"), "bf16", CPU, "train", CFG)
    assert list(plain.losses) == ["fp32", "fp32 other batches 1", "bf16"]
    more = CFG.model_copy(update={"jitter_runs": 1, "batch_runs": 2})
    check = check_precision(workload, Settings(amp="bf16"), "bf16", CPU, "train", more)
    assert list(check.losses) == ["fp32", "fp32 jittered 1", "fp32 other batches 1",
                                  "fp32 other batches 2", "bf16"]  # fmt: skip
    assert check.band >= plain.band  # the band is the widest of its runs: more can only widen it


def _scripted(ref: list[float], precision: list[float], band_delta: float):  # noqa: ANN202
    """Training runs in the check's order (fp32, other batches, the precision), their losses
    given: the rule judged exactly, without training noise."""
    runs = [ref, [x + band_delta for x in ref], precision]
    calls = iter(range(len(runs)))

    def train(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return runs[next(calls)]

    return train


@pytest.mark.parametrize(
    ("learns", "resolution", "accepted"),
    [(True, 0.01, True), (True, 0.0, False), (False, 0.01, False)],
    ids=["learns", "no resolution", "barely learns"],
)
def test_a_gap_below_what_the_check_resolves_is_accepted_however_narrow_the_band(
    monkeypatch: pytest.MonkeyPatch, learns: bool, resolution: float, accepted: bool
) -> None:
    """fp32 runs alike to five digits (a band of 1e-5) and a precision 0.2% of the start away at
    one pass (MONAI's UNet on one input draw): accepted when fp32 learnt 80% of its start loss in
    the run (1% of that is 0.8%), not when it learnt 1%, nor with the resolution off."""
    end = 0.2 if learns else 0.99
    ref = [1.0, 1.0, 0.5 * (1 + end), 0.5 * (1 + end), end, end, end]  # 3 passes of 2, final
    precision = [x + (0.002 if i == 2 else 0.0) for i, x in enumerate(ref)]
    monkeypatch.setattr(training, "train", _scripted(ref, precision, 1e-5))
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    cfg = PrecisionCheckSettings(steps=6, batches=2, resolution=resolution)
    check = check_precision(workload, Settings(amp="bf16"), "bf16", CPU, "train", cfg)
    assert check.accepted is accepted, check.summary
    assert check.band < 1e-4 and check.gap == pytest.approx(0.001)  # the pass's mean moved
    if accepted:
        assert "within 0.01 x what fp32 learnt" in check.summary
        assert check.floor == pytest.approx(0.01 * 0.8)
    else:
        assert "does not train like fp32" in check.summary


def test_a_verdict_with_inf_or_nan_reads_back_from_json() -> None:
    """A diverged run (Inf) and a gap not measured (NaN) survive the study's JSON."""
    check = PrecisionCheck(precision="fp16", own_path=Settings(amp="fp16"), mode="train",
                           accepted=False, summary="x", gap=math.nan, band=math.inf,
                           losses={"fp16": [1.0, math.inf]})  # fmt: skip
    for back in (PrecisionCheck.model_validate_json(check.model_dump_json()),
                 PrecisionCheck.model_validate(json.loads(json.dumps(check.model_dump(mode="json"))))):  # fmt: skip
        assert math.isnan(back.gap) and back.band == math.inf and back.losses == check.losses


@pytest.mark.slow
def test_advise_judges_each_precision_once_and_says_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = gate_module.check_precision

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the real check, counted
        calls.append(str(args[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(gate_module, "check_precision", counted)
    space = tmp_path / "s.yaml"
    space.write_text(
        "name: s\ndevice: cpu\nknobs: {memory_format: [contiguous, channels_last], "
        "amp: ['off', bf16]}\nper_layer: false\nrace: false\n"
        "precision_check: {steps: 12, batches: 2}\n"
        "timing: {warmup_runs: 1, warmup_s: 0, min_samples: 3, max_samples: 3, max_time_s: 0.1}\n"
    )
    storage = f"sqlite:///{tmp_path / 's.db'}"
    kw = dict(mode="train", device="cpu", space=str(space), storage=storage)
    good = advisor.advise(model_file=str(DATA / "tiny_cnn.py"), **kw)
    assert calls == ["bf16"]  # two bf16 candidates, one check
    bf16 = good.trials[good.trials["label"].str.contains("amp=bf16")]
    assert set(bf16["status"]) == {"ok"}
    (line,) = good.config.result.precisions
    assert line.startswith("bf16: trains like fp32 on this model (12 steps")
    again = advisor.advise(model_file=str(DATA / "tiny_cnn.py"), **{**kw, "fresh": False})
    assert calls == ["bf16"] and again.config.result.precisions == [line]  # stored with the study

    bad = advisor.advise(model_file=str(DATA / "below_bf16.py"), **kw)
    rows = bad.trials[bad.trials["label"].str.contains("amp=bf16")]
    assert set(rows["status"]) == {"rejected"}
    assert all("does not train like fp32" in r for r in rows["reason"])
    assert all(a.startswith("precision_check.band_factor=") for a in rows["accepted_with"])
    assert "amp" not in bad.settings.changes()
