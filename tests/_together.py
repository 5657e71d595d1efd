"""Start several `advisor` commands at the same instant, as concurrent users do.

Each process imports everything first, says it is ready, and runs its command only when the test
says go: on a busy 2-core machine one process can otherwise start seconds after the other and
find the work already done, which would make any "both took part" or "both raced" check luck."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import run_env

_LAUNCHER = """
import contextlib, pathlib, sys, time
import optuna, sqlalchemy, torch
import advisor.cli, advisor.search, advisor.service, advisor.search.storage, advisor.worker
with contextlib.suppress(ImportError):
    import psycopg
ready, go = map(pathlib.Path, sys.argv[1:3])
ready.touch()
while not go.exists():
    time.sleep(0.01)
sys.exit(advisor.cli.main(sys.argv[3:]))
"""


def start_together(
    tmp: Path, argvs: list[list[str]], cwd: Path | None = None
) -> list[subprocess.Popen[str]]:
    """One process per argv (`advisor` CLI arguments), released together once all are ready."""
    go = tmp / "go"
    ready = [tmp / f"ready{i}" for i in range(len(argvs))]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(r), str(go), *argv],
            env=run_env(),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r, argv in zip(ready, argvs, strict=True)
    ]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):
        assert time.monotonic() < deadline, "the processes did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()
    return procs
