"""Two runs started together on a new SQLite store: both succeed, and they agree."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import DATA, run_env
from tests.hostile._cli import ROOT

# Both processes import everything first, then start together when the test says go.
_LAUNCHER = """
import pathlib, sys, time
import advisor.cli, advisor.service, optuna, sqlalchemy, torch
ready, go = map(pathlib.Path, sys.argv[1:3])
ready.touch()
while not go.exists():
    time.sleep(0.01)
sys.exit(advisor.cli.main(sys.argv[3:]))
"""


def test_two_runs_on_a_new_sqlite_store_both_succeed_and_agree(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    go = tmp_path / "go"
    procs = []
    for i in range(2):
        argv = ["advise", "--layer", "Conv2d(8, 16, 3, padding=1)", "--input-shape", "2,8,32,32",
                "--device", "cpu", "--space", str(DATA / "grid8_cpu.yaml"), "--storage", url,
                "--out", str(tmp_path / f"t{i}.json"), "--quiet", "--in-process"]  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(tmp_path / f"ready{i}"), str(go), *argv],
            env=run_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    a, b = (json.loads((tmp_path / f"t{i}.json").read_text()) for i in range(2))
    assert a["settings"] == b["settings"]
    for field in ("baseline", "tuned"):
        assert a["result"][field] == b["result"][field]  # the same re-time, not two
    assert a["result"]["trials"] == b["result"]["trials"] == 8
