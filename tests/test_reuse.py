"""Reuse (advisor.reuse): the same advise asked again, with the default storage, is answered
from the stored advice before anything is probed, loaded or measured."""

from __future__ import annotations

import inspect
import io
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

import advisor
from advisor import service
from advisor.advice import Advice
from advisor.device.environment import cache_dir
from advisor.report.progress import ProgressReporter
from advisor.reuse import AdviceReuse, entry_path, partial
from advisor.service import run_advise
from advisor.space import load_space, with_tolerances
from advisor.stages.effort import effort_of
from tests.conftest import DATA, FAST_SPACE

CPU = torch.device("cpu")
REUSED = "reused the advice of the run of"


@pytest.fixture
def model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the tiny model (its bytes are edited below), with a cache folder of its own."""
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.py"
    shutil.copy(DATA / "tiny_cnn.py", path)
    return path


def _kw(path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "model_file": str(path),
        "mode": "train",
        "device": "cpu",
        "space": FAST_SPACE,
        "storage": None,
        **extra,
    }


def _nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline's first steps fail: a reused answer must not reach them."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the run measured again")

    for name in ("probe_model", "FreshProcess", "make_workload", "make_evaluator"):
        monkeypatch.setattr(service, name, refused)


def _lookup(**kw: Any) -> AdviceReuse:
    """What run_advise looks up for these arguments (its resolved space as it makes it)."""
    params = inspect.signature(run_advise).bind(**kw)
    params.apply_defaults()
    args = dict(params.arguments)
    space = with_tolerances(load_space(args["space"], CPU), args["tolerances"] or {})
    sp = effort_of(args["effort"]).space(space, CPU)
    return AdviceReuse.lookup(run_advise, args, CPU, sp)


def _summary(advice: Advice) -> list[str]:
    console = Console(record=True, width=400, file=io.StringIO())
    ProgressReporter(console=console).summary(advice)
    return console.export_text().splitlines()


def _without_notes(advice: Advice) -> Any:
    assert advice.config.result is not None
    return advice.config.model_copy(
        update={"result": advice.config.result.model_copy(update={"notes": []})}
    )


def test_a_second_run_is_answered_from_the_stored_advice(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Isolated, as the CLI runs: the probe, the final check's spare and the worker are what a
    # second run must not start again.
    kw = _kw(model_file, space=str(DATA / "per_layer_cpu.yaml"), isolate=True)
    first = advisor.advise(**kw)
    assert first.config.result is not None and not any(
        REUSED in n for n in first.config.result.notes
    )
    assert len(list((cache_dir() / "advice").glob("*.json"))) == 1

    _nothing_runs(monkeypatch)
    again = advisor.advise(**kw)
    assert again.config.result is not None
    note = again.config.result.notes[0]
    assert note.startswith(REUSED) and "nothing was measured again" in note
    assert "not the modules it imports" in note and "--fresh" in note
    assert again.config.result.notes[1:] == first.config.result.notes
    assert again.settings == first.settings
    assert _without_notes(again) == _without_notes(first)  # created, environment, stages too
    assert again.trials.equals(first.trials)
    assert again.layer_trials.equals(first.layer_trials) and first.layer_choices
    assert again.best.settings == first.best.settings and again.pick.why == first.pick.why
    # The summary prints the same tables and lines, and says what it reused.
    said = _summary(again)
    assert [line for line in said if line not in _summary(first)][0].startswith(f"Note: {REUSED}")
    assert [line for line in _summary(first) if line not in said] == []
    # Saved, the config carries the note too.
    again.save(model_file.parent / "tuned.json")
    assert REUSED in (model_file.parent / "tuned.json").read_text()


def test_another_question_or_fresh_is_not_answered_from_it(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw = _kw(model_file)
    advisor.advise(**kw)
    assert _lookup(**kw).advice is not None
    # Keyed by what they resolve to: the CLI passes no tolerances as {}, the API as None.
    assert _lookup(**{**kw, "device": "auto"}, tolerances={}).advice is not None
    assert _lookup(**kw, effort="quick").advice is None
    assert _lookup(**kw, steps=1000).advice is None
    assert _lookup(**kw, tolerances={"grad_tolerances.fp32": 2e-3}).advice is None
    assert _lookup(**{**kw, "storage": "memory"}).key is None  # a storage named: never cached
    model, inputs = torch.nn.Conv2d(3, 3, 1), (torch.randn(1, 3, 4, 4),)
    assert _lookup(**{**kw, "model_file": None}, model=model, inputs=inputs).key is None

    # The model file's bytes are its identity: an edit (even a comment) is tuned anew.
    model_file.write_text(model_file.read_text() + "\n# edited\n")
    assert _lookup(**kw).advice is None
    edited = advisor.advise(**kw)
    assert edited.config.result is not None
    assert not any(REUSED in n for n in edited.config.result.notes)

    # fresh tunes anew and drops the stored answer; its own answer is stored in its place.
    made: list[int] = []
    real = service.make_evaluator
    monkeypatch.setattr(service, "make_evaluator", lambda *a, **k: made.append(1) or real(*a, **k))
    stored = entry_path(_lookup(**kw).key or "")
    fresh = advisor.advise(**kw, fresh=True)
    assert made and fresh.config.result is not None
    assert not any(REUSED in n for n in fresh.config.result.notes)
    assert stored.is_file()
    assert _lookup(**kw).advice is not None


def test_a_corrupt_foreign_or_partial_entry_is_not_reused(model_file: Path) -> None:
    kw = _kw(model_file)
    advisor.advise(**kw)
    path = entry_path(_lookup(**kw).key or "")
    good = path.read_text()
    for bad in ("{not json", good[: len(good) // 2], '{"format": 2, "key": "x"}',
                good.replace('"format":2', '"format":3'), good.replace('"format":2', '"format":1'),
                ""):  # fmt: skip
        path.write_text(bad)
        assert _lookup(**kw).advice is None  # no traceback: answered afresh
    path.write_text(good.replace(f'"key":"{path.stem}"', '"key":"another"'))
    assert _lookup(**kw).advice is None  # an entry copied under another key
    # Answered afresh: the stored study resumed, its finalists re-timed (so the pick may differ
    # from the first within noise: it did in CI under load), and the answer stored again
    again = advisor.advise(**kw)
    assert again.config.result is not None and not any(
        REUSED in n for n in again.config.result.notes
    )
    assert _lookup(**kw).advice is not None

    # An answer the budget cut short is not stored: a rerun resumes the study instead.
    path.unlink()
    assert partial(again) is None
    again.outcome.not_measured.append("channels_last")
    assert partial(again) is not None
    _lookup(**kw).store(again)
    assert not path.exists()
