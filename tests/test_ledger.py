"""The one record of what was measured (advisor/search/ledger.py): entries written once, kept in
the study, and every candidate's standing derived from them by one rule."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from advisor.config import FinalCheck
from advisor.errors import StorageError
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.measure.stop import Stop
from advisor.measure.verdict import PrecisionCheck
from advisor.search.ledger import RECORD_FORMAT, Ledger, check_format

DEFAULT = Settings()
CL = Settings(memory_format="channels_last")
BF16 = Settings(amp="bf16")
COMPILED = Settings(memory_format="channels_last", compile="default")


def _r(settings: Settings, ms: float, **kw: object) -> TrialResult:
    return TrialResult(settings=settings, status="ok", rel_error=0.0,
                       measurement=Measurement(samples_ms=[ms] * 5), **kw)  # type: ignore[arg-type]  # fmt: skip


def _study(*results: TrialResult) -> optuna.Study:
    study = optuna.create_study()
    labels = [r.settings.label() for r in results]
    for r in results:
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.COMPLETE, value=r.median_ms, params={"p": r.settings.label()},
            distributions={"p": CategoricalDistribution(sorted(set(labels)))},
            user_attrs={"result": r.model_dump(mode="json")}))  # fmt: skip
    return study


def test_entries_are_kept_in_the_study_and_another_reader_sees_them() -> None:
    study = _study(_r(DEFAULT, 10.0), _r(BF16, 6.0, pending="precision"))
    mine = Ledger(study, DEFAULT, run="a")
    mine.trial(_r(COMPILED, 4.0), "compile")
    mine.verdict(TrialResult(settings=BF16, status="rejected", reason="off by 5%"))
    check = PrecisionCheck(precision="bf16", own_path=BF16, mode="train", accepted=False,
                           gap=0.1, band=0.01, summary="bf16: does not train like fp32")  # fmt: skip
    mine.precision(check)
    mine.precision(check)  # judged once: not kept twice
    final = FinalCheck(where="fresh process", speedup=1.2, speedup_ci=(1.1, 1.3), rounds=9,
                       held=True)  # fmt: skip
    mine.final_check(COMPILED, final)
    other = Ledger(study, DEFAULT, run="b")
    assert [r.settings for r in other.results()] == [DEFAULT, BF16, COMPILED]
    # the compile is not an optuna trial
    assert other.origins() == [(0, "search"), (1, "search"), (-1, "compile")]
    assert other.standing(BF16).status == "rejected"  # type: ignore[union-attr]
    assert other.standing(BF16).measurement.median_ms == 6.0  # type: ignore[union-attr]
    assert other.checks() == [check]
    assert [e.final for e in other.of_kind("final_check")] == [final]
    assert len(other.entries) == 2 + 4


def test_only_the_runs_latest_re_time_round_is_paired() -> None:
    ledger = Ledger.of([_r(DEFAULT, 10.0), _r(CL, 8.0), _r(BF16, 7.0)], DEFAULT)
    retimed = [r.model_copy(update={"retimed": True, "measurement": Measurement(samples_ms=[ms] * 7)})
               for r, ms in zip(ledger.results(), (11.0, 8.5, 7.5), strict=True)]  # fmt: skip
    ledger.retime(retimed)
    assert [r.retimed for r in ledger.results()] == [True, True, True]
    assert ledger.standing(BF16).median_ms == 7.5  # type: ignore[union-attr]
    ledger.retime([retimed[0].model_copy(update={"measurement": Measurement(samples_ms=[12.0] * 7)}),
                   retimed[1]])  # fmt: skip
    assert ledger.rounds() == 2
    by = {r.settings.label(): r for r in ledger.results()}
    assert by["default"].retimed and by["default"].median_ms == 12.0
    # re-timed in an earlier window: its measurement stands, no longer paired with this round's
    assert not by["amp=bf16"].retimed and by["amp=bf16"].median_ms == 7.5
    # the same study read as another run: its rounds are its own
    other = Ledger(None, DEFAULT, run="other", entries=ledger.entries)
    assert other.rounds() == 0 and not any(r.retimed for r in other.results())


def test_a_later_stage_measured_again_supersedes_and_a_search_point_keeps_its_first() -> None:
    study = _study(_r(DEFAULT, 10.0), _r(CL, 8.0), _r(CL, 1.0))  # a duplicate trial of a point
    ledger = Ledger(study, DEFAULT, run="a")
    assert ledger.standing(CL).median_ms == 8.0  # type: ignore[union-attr]
    stop = Stop(kind="cannot_pay", horizon_steps=10, rival="x", ms=4.0, rival_ms=5.0,
                saving_ms=1.0, cold_s=30.0)  # fmt: skip
    ledger.trial(_r(COMPILED, 4.0).model_copy(update={"status": "stopped", "stop": stop}),
                 "compile")  # fmt: skip
    ledger.trial(_r(COMPILED, 3.5), "compile")  # judged again for another horizon
    assert ledger.standing(COMPILED).status == "ok"  # type: ignore[union-attr]
    assert len(ledger.results()) == 3


def test_the_memory_limit_is_applied_when_the_ledger_is_read() -> None:
    big = _r(CL, 5.0, peak_memory_mb=900.0)
    study = _study(_r(DEFAULT, 10.0, peak_memory_mb=1000.0), big)
    assert Ledger(study, DEFAULT).standing(CL).status == "ok"  # type: ignore[union-attr]
    limited = Ledger(study, DEFAULT, max_memory_mb=500.0)
    assert limited.standing(CL).status == "rejected"  # type: ignore[union-attr]
    assert "--max-memory limit of 500 MB" in (limited.standing(CL).reason or "")  # type: ignore[union-attr]
    assert limited.baseline().status == "ok"  # type: ignore[union-attr]  # the baseline stays


def test_a_study_stored_in_another_format_is_refused_in_one_line() -> None:
    check_format(optuna.create_study(), "new")  # no trials: new, and the search marks it
    old = _study(_r(DEFAULT, 10.0))
    with pytest.raises(StorageError) as e:
        check_format(old, "infer-abc@fp")
    message = str(e.value)
    assert "\n" not in message and "'infer-abc@fp'" in message and "--fresh" in message
    assert "record format 1" in message
    old.set_user_attr("record_format", RECORD_FORMAT - 1)  # its results had a field no more read
    with pytest.raises(StorageError, match=f"record format {RECORD_FORMAT - 1}, this one reads"):
        check_format(old, "infer-abc@fp")
    old.set_user_attr("record_format", RECORD_FORMAT)
    check_format(old, "infer-abc@fp")  # this format: read as it is


def test_a_candidate_waiting_for_its_precision_stands_by_that_precisions_verdict() -> None:
    """A verdict on a precision, paid for one candidate, is every waiting candidate's at it: a
    rejected precision rejects them unchecked; an accepted one leaves them waiting for their own
    numeric checks, and their reason no longer says the training check was not paid."""
    cl_bf16 = Settings(memory_format="channels_last", amp="bf16")
    oneDNN = Settings(cpu_fp32="bf16")
    ledger = Ledger.of([_r(DEFAULT, 10.0), _r(cl_bf16, 6.0, pending="precision", precision="bf16"),
                        _r(oneDNN, 7.0, pending="precision", precision="bf16")], DEFAULT)  # fmt: skip
    assert "training check was not paid" in ledger.standing(cl_bf16).reason  # type: ignore[union-attr,operator]

    def judge(own: Settings, accepted: bool) -> PrecisionCheck:
        check = PrecisionCheck(precision="bf16", own_path=own, mode="train", accepted=accepted,
                               gap=0.1, band=0.01, summary="bf16: does not train like fp32")  # fmt: skip
        ledger.precision(check)
        return check

    refused = judge(BF16, accepted=False)  # autocast's path: cl_bf16's, not oneDNN's
    cl = ledger.standing(cl_bf16)
    assert cl is not None and cl.status == "rejected" and cl.pending is None
    assert cl.rejection == "precision" and cl.precision_check == refused
    assert cl.reason == "bf16: does not train like fp32: bf16 is not accepted here"
    assert cl.rejected_by == "precision_check.band_factor=10"
    assert cl.measurement is not None and cl.measurement.median_ms == 6.0  # still as measured
    assert ledger.standing(oneDNN).pending == "precision"  # type: ignore[union-attr]
    judge(oneDNN, accepted=True)
    waits = ledger.standing(oneDNN)
    assert waits is not None and waits.status == "ok" and waits.pending == "checks"
    assert waits.reason is not None and "numeric checks were not paid" in waits.reason
