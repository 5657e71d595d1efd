"""Running `python -m advisor ...` as a user does, and what a one-line error must look like."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import run_env

ROOT = Path(__file__).parent.parent.parent


def advisor_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "advisor", *args],
        capture_output=True,
        text=True,
        env={**run_env(), **(env or {})},
        cwd=cwd or ROOT,
        timeout=timeout,
    )


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single stderr line of a bad-input exit, checked to name every needle."""
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("advisor: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert r.stdout == ""
    return lines[0]
