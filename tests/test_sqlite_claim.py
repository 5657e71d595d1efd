"""On SQLite two processes can pop the same waiting trial: exactly one of them may claim it."""

from __future__ import annotations

from pathlib import Path

import optuna

from advisor.search.sqlite_claim import TrialClaims
from advisor.search.storage import open_storage


def test_a_trial_popped_by_two_processes_is_claimed_by_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    # Two storages: what two processes hold (each with its own optuna cache).
    first, second = open_storage(url), open_storage(url)
    study = optuna.create_study(storage=first, study_name="s")
    study.enqueue_trial({"x": 1})
    popped = study.ask()  # the first process pops the waiting trial
    other_study = optuna.load_study(study_name="s", storage=second)
    trial_id = second.get_trial_id_from_study_id_trial_number(
        second.get_study_id_from_name("s"), popped.number
    )
    # The second process popped it too (SQLite has no row lock): the same trial, its own handle.
    raced = optuna.Trial(other_study, trial_id)
    study_id = first.get_study_id_from_name("s")
    mine = TrialClaims(first, study_id, owner="host:1")
    theirs = TrialClaims(second, study_id, owner="host:2")
    assert mine.claim(popped) is True
    assert theirs.claim(raced) is False  # it reads the owner from the database, not its copy
    assert mine.claim(popped) is True  # claiming one's own trial again is harmless
    assert first.get_trial(trial_id).user_attrs["worker"] == "host:1"
    # The lock file lives beside the database.
    assert (tmp_path / "s.db.claims.lock").exists()


def test_the_first_claim_wins_whichever_process_it_is(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    first, second = open_storage(url), open_storage(url)
    study = optuna.create_study(storage=first, study_name="s")
    study.enqueue_trial({"x": 1})
    popped = study.ask()
    other_study = optuna.load_study(study_name="s", storage=second)
    trial_id = first.get_trial_id_from_study_id_trial_number(
        first.get_study_id_from_name("s"), popped.number
    )
    raced = optuna.Trial(other_study, trial_id)
    study_id = first.get_study_id_from_name("s")
    assert TrialClaims(second, study_id, owner="host:2").claim(raced) is True
    assert TrialClaims(first, study_id, owner="host:1").claim(popped) is False
