"""Two runs started together on a new store (SQLite, or a fresh PostgreSQL database): both
succeed, and they agree."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._cli import ROOT
from tests._together import start_together
from tests.conftest import DATA

PG_URL = os.environ.get("ADVISOR_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a store nobody has used yet: a new SQLite file or a scratch database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'new.db'}"
        return
    import psycopg

    name = f"advisor_race_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
    except psycopg.Error as e:
        pytest.skip(f"no PostgreSQL server to create a scratch database on: {e}")
    try:
        yield PG_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.mark.slow  # two CLI runs started together (7-8 s each store)
def test_two_runs_on_a_new_store_both_succeed_and_agree(tmp_path: Path, new_store: str) -> None:
    url = new_store
    argvs = [
        ["advise", "--layer", "Conv2d(8, 16, 3, padding=1)", "--input-shape", "2,8,32,32",
         "--device", "cpu", "--space", str(DATA / "grid8_cpu.yaml"), "--storage", url,
         "--out", str(tmp_path / f"t{i}.json"), "--quiet", "--in-process"]
        for i in range(2)
    ]  # fmt: skip
    procs = start_together(tmp_path, argvs, cwd=ROOT)
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    a, b = (json.loads((tmp_path / f"t{i}.json").read_text()) for i in range(2))
    assert a["settings"] == b["settings"]
    for field in ("baseline", "tuned"):
        assert a["result"][field] == b["result"][field]  # the same re-time, not two
    # and the same final check, not two (each of a small win could go either way when busy)
    assert a["result"].get("final_check") == b["result"].get("final_check")
    assert a["result"]["trials"] == b["result"]["trials"] == 8
