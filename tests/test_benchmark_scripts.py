"""Every benchmark script imports under today's package layout and answers `--help`.

Scripts with tests of their own (zoo, suite, advise_walltime, ...) are loaded there; this covers
the rest in one child process (one torch import), so a moved module cannot leave a script behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_env

BENCH = Path(__file__).parent.parent / "benchmarks"
TESTED_ELSEWHERE = {"advise_walltime", "check_cost", "gpu_check", "process_spread", "suite", "zoo"}
MODULES = {"suite_models", "published_models"}  # imported by the scripts, not run

_CHILD = """
import contextlib, io, json, runpy, sys
sys.path.insert(0, sys.argv[1])
out = {}
for path in json.loads(sys.argv[2]):
    sys.argv = [path, "--help"]
    text = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(text):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            code = e.code or 0
    out[path] = [code, text.getvalue()]
print(json.dumps(out))
"""


@pytest.mark.slow  # imports every script (5 s)
def test_every_benchmark_script_imports_and_answers_help() -> None:
    scripts = sorted(p for p in BENCH.glob("*.py") if p.stem not in TESTED_ELSEWHERE)
    assert scripts, "no benchmark scripts found"
    helped = [str(p) for p in scripts if p.stem not in MODULES]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(BENCH), json.dumps(helped)],
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for path, (code, text) in results.items():
        assert code == 0, f"{path} --help exited {code}"
        assert "usage" in text.lower() or "python benchmarks/" in text, f"{path}: {text[:200]}"
    for name in MODULES:
        check = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(BENCH)!r}); import {name}",
            ],
            capture_output=True,
            text=True,
            env=run_env(),
            timeout=120,
        )
        assert check.returncode == 0, check.stderr[-2000:]
