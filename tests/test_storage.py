"""Study storages: corrupt files are one clear line (exit 2) and lose nothing; URLs and errors."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

import advisor
from advisor.errors import StorageError
from advisor.search.storage import _rdb_url, _redact, default_storage_url, open_storage
from tests._cli import advisor_cli_many, one_line_error
from tests.conftest import DATA

LAYER = ["--layer", "Conv2d(3, 4, 3)", "--input-shape", "1,3,16,16", "--device", "cpu"]


def _trials_of(url: str, prefix: str) -> list[tuple[int, str, dict]]:
    storage = open_storage(url)
    (name,) = [n for n in optuna.get_all_study_names(storage) if n.startswith(prefix + "@")]
    study = optuna.load_study(study_name=name, storage=storage)
    return [(t.number, t.state.name, t.user_attrs.get("result")) for t in study.trials]


def test_corrupt_storage_files_are_one_line_errors_and_lose_nothing(tmp_path: Path) -> None:
    # A study in the default storage (the cache folder), which must survive untouched.
    advisor.advise(layer="Conv2d(3, 4, 3)", input_shape="1,3,16,16", device="cpu",
                   space=str(DATA / "fast_cpu.yaml"), storage=None, study_name="keep-me")  # fmt: skip
    kept = _trials_of(default_storage_url(), "keep-me")
    garbage = os.urandom(4096)
    bad_db, bad_log = tmp_path / "bad.db", tmp_path / "bad.log"
    bad_db.write_bytes(garbage)
    bad_log.write_bytes(garbage)
    out = tmp_path / "never.json"
    # The four commands in one fresh process (tests/_cli.py: one interpreter start)
    runs = advisor_cli_many({
        "not a database": ["advise", *LAYER, "--storage", f"sqlite:///{bad_db}", "--out", str(out)],
        "not an optuna journal": ["advise", *LAYER, "--storage", str(bad_log), "--out", str(out)],
        "needs --storage": ["worker", *LAYER],
        "shared with the other workers": ["worker", *LAYER, "--storage", "memory"],
    })  # fmt: skip
    for needle, r in runs.items():
        one_line_error(r, needle)
    assert bad_db.read_bytes() == garbage and bad_log.read_bytes() == garbage  # never "repaired"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.db", "bad.log"]  # nothing written
    assert _trials_of(default_storage_url(), "keep-me") == kept


@pytest.mark.parametrize(
    "url,needle",
    [
        ("postgresql://root@127.0.0.1:1/test", "cannot open storage postgresql://root@127.0.0.1:1"),
        ("sqlite:////proc/no/such/dir/s.db", "cannot create the folder"),
    ],
)
def test_unusable_storage_is_a_storage_error(url: str, needle: str) -> None:
    with pytest.raises(StorageError, match="^" + needle) as e:
        open_storage(url)
    assert "\n" not in str(e.value)


def test_journal_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="is a directory"):
        open_storage(str(tmp_path))


def test_urls() -> None:
    assert _rdb_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert _rdb_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert _rdb_url("sqlite:///x.db") == "sqlite:///x.db"
    assert _redact("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert _redact("postgresql://u@h/db") == "postgresql://u@h/db"
    assert default_storage_url().endswith("studies.db")
    assert isinstance(open_storage("memory"), optuna.storages.InMemoryStorage)


def test_a_final_check_is_kept_in_the_study_for_the_runs_that_share_it(tmp_path: Path) -> None:
    """Two runs of one study make one final check: the first to claim it measures and keeps it
    in the ledger, the other reads it back unchanged (each checking a small win on a busy
    machine disagreed)."""
    from advisor.config import FinalCheck
    from advisor.knobs import Settings
    from advisor.search.ledger import Ledger
    from advisor.search.storage import Claims

    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    first, second = (Ledger(optuna.load_study(study_name="s", storage=storage), Settings(),
                            run=who, storage=storage) for who in ("one", "two"))  # fmt: skip
    claims = Claims(study, storage)
    assert claims.claim("final_check:k", "one", land_s=0.0)
    assert not claims.claim("final_check:k", "two", land_s=0.0)
    assert second.wait_shared("final_check", "k", timeout_s=0.2, poll_s=0.05) == []
    check = FinalCheck(where="fresh process", speedup=1.3, speedup_ci=(1.1, 1.5), rounds=9,
                       held=True, one_thread=(1.2, 1.05, 1.3), other_load=0.4)  # fmt: skip
    first.final_check(Settings(memory_format="channels_last"), check, group="k")
    got = second.wait_shared("final_check", "k", timeout_s=5.0)
    assert [e.final for e in got] == [check]
    # kept apart from a re-time of the same candidates
    assert second.shared("retime", "k") == []


def test_a_re_time_round_is_read_only_once_each_of_its_finalists_is_written(
    tmp_path: Path,
) -> None:
    """A run writes its round an entry at a time: a run sharing the study that read the round
    half-written took the default's trial for its re-time (two runs on one PostgreSQL study
    disagreed on the baseline about one time in eight under load)."""
    from advisor.knobs import Settings
    from advisor.measure.results import TrialResult
    from advisor.measure.stats import Measurement
    from advisor.search.ledger import Ledger

    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url)
    optuna.create_study(study_name="s", storage=storage)
    first, second = (Ledger(optuna.load_study(study_name="s", storage=storage), Settings(),
                            run=who, storage=storage) for who in ("one", "two"))  # fmt: skip
    finalists = [
        TrialResult(settings=s, status="ok", measurement=Measurement(samples_ms=[ms, ms * 1.01]))
        for s, ms in ((Settings(), 2.0), (Settings(memory_format="channels_last"), 1.5))
    ]
    first.retime(finalists[:1], group="g")  # the round's first entry, the second not yet
    assert second.wait_shared("retime", "g", timeout_s=0.2, poll_s=0.05, size=2) == []
    first.retime(finalists, group="g")  # a whole round (the next one)
    got = second.wait_shared("retime", "g", timeout_s=5.0, size=2)
    assert sorted(e.result.median_ms for e in got if e.result) == pytest.approx([1.5075, 2.01])
    assert second.shared("retime", "g") != []  # a round of one is whole at size 1


def _claim_at_once(url: str, key: str, owner: str, barrier: Any, out: Any) -> None:
    from advisor.search.storage import Claims

    storage = open_storage(url)
    record = Claims(optuna.load_study(study_name="s", storage=storage), storage)
    barrier.wait()
    start = time.perf_counter()
    out.put((owner, record.claim(key, owner), time.perf_counter() - start))


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_processes_claiming_at_once_on_a_local_storage_get_one_winner_without_waiting(
    tmp_path: Path, kind: str
) -> None:
    """SQLite files and journal files are local: a claim is read and written under a file lock,
    so the first wins at once (no settling sleep, which cost every re-time and final check
    half a second), and two processes racing for it never both hold it."""
    url = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else str(tmp_path / "s.log")
    optuna.create_study(study_name="s", storage=open_storage(url))
    ctx = multiprocessing.get_context("fork")
    for key in ("a", "b", "c"):
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_claim_at_once, args=(url, key, who, barrier, out))
                 for who in ("one", "two")]  # fmt: skip
        for p in procs:
            p.start()
        got = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert sorted(held for _, held, _ in got) == [False, True], got
        assert all(took < 0.4 for _, _, took in got), got  # land_s is 0.5


def test_one_record_claims_key_after_key(tmp_path: Path) -> None:
    from advisor.search.storage import Claims

    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    record = Claims(study, storage)
    assert all(record.claim(k, "one") for k in ("a", "b", "c"))  # each claim takes a new lock
    assert not Claims(study, storage).claim("b", "two")
