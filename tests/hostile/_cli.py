"""Running `python -m advisor ...` as a user does, and what a one-line error must look like."""

from __future__ import annotations

import json
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
    lines = r.stderr.splitlines()  # a blank line before or after it counts: one line is one
    assert len(lines) == 1 and r.stderr.endswith("\n"), r.stderr[-3000:]
    assert lines[0].startswith("advisor: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert r.stdout == ""
    return lines[0]


# Many bad-input cases in one fresh process: each is `advisor.cli.main(argv)` with its own stdout
# and stderr captured and its exit code kept; an exception that escapes main is reported as the
# traceback it would print. What a user's shell sees, at one interpreter start for all cases.
_MANY = r"""
import contextlib, io, json, sys, traceback
import advisor.cli
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        try:
            code = advisor.cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    out[name] = [code, so.getvalue(), se.getvalue()]
sys.stdout.write(json.dumps(out))
"""


def advisor_cli_many(
    cases: dict[str, list[str]], cwd: Path | None = None, timeout: float = 600
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run each case's argv through the CLI's `main` in one fresh process (see `_MANY`)."""
    r = subprocess.run(
        [sys.executable, "-c", _MANY, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=run_env(),
        cwd=cwd or ROOT,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return {
        name: subprocess.CompletedProcess(cases[name], code, stdout, stderr)
        for name, (code, stdout, stderr) in json.loads(r.stdout).items()
    }
