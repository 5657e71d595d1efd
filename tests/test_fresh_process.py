"""tests/_cli.py's fresh processes: forked from the fork server where nothing read at import
differs, a new interpreter otherwise; either way the caller sees what a subprocess would show."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.execute import children
from tests._cli import (
    _forkable,
    advisor_cli,
    fresh_process,
    import_time_changes,
    python_code,
    run_env,
)


def report(code: str) -> None:
    """Print what the process sees, then exit with `code` (a signal's name: killed by it)."""
    print(os.getcwd(), os.environ.get("FRESH_MARK"), "torch" in sys.modules, sys.stdin.read())
    print("to stderr", file=sys.stderr)
    if code.startswith("SIG"):
        os.kill(os.getpid(), getattr(signal, code))
    sys.exit(int(code))


def sleep_long() -> None:
    import time

    time.sleep(60)


def server_env(**extra: str) -> dict[str, str]:
    """The fork server's environment (an earlier test in this worker may have left a variable
    read at import changed here, as a compile leaves Inductor's), with `extra` over it."""
    assert children._server_env is not None
    return {**children._server_env, **extra}


def test_a_forked_process_has_its_own_streams_environment_folder_and_exit_code(
    tmp_path: Path,
) -> None:
    env = server_env(FRESH_MARK="here")
    r = fresh_process(report, "3", env=env, cwd=tmp_path)
    assert r is not None, import_time_changes(env)
    assert r.returncode == 3
    # stdin is empty (/dev/null); torch was imported by the server, not by the test's body
    assert r.stdout == f"{tmp_path} here True \n"
    assert r.stderr == "to stderr\n"
    killed = fresh_process(report, "SIGKILL", env=env)
    assert killed is not None and killed.returncode == -signal.SIGKILL


def test_a_process_past_its_timeout_is_killed_and_says_so() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        fresh_process(sleep_long, env=server_env(), timeout=0.5)


def test_a_variable_read_at_import_starts_a_new_interpreter() -> None:
    assert _forkable(server_env(PYTHONPATH=run_env()["PYTHONPATH"]))  # the repository: on the path
    for changed in ({"OMP_NUM_THREADS": "1"}, {"ADVISOR_PLUGINS": "tests.plugins"},
                    {"PYTHONPATH": "/nowhere"}):  # fmt: skip
        assert import_time_changes(server_env(**changed)) == list(changed)
        assert fresh_process(report, "0", env=server_env(**changed)) is None
    # A variable read when a command runs forks: the command reads it from its environment.
    assert _forkable(server_env(ADVISOR_CACHE_DIR="/tmp/elsewhere"))


def test_the_command_forked_and_in_a_new_interpreter_say_the_same() -> None:
    forked = advisor_cli("advise", "--layer", "Conv2d(3, 4, 3)", "--input-shape", "1,3,8,8",
                         "--storage", "nope://x")  # fmt: skip
    new = advisor_cli("advise", "--layer", "Conv2d(3, 4, 3)", "--input-shape", "1,3,8,8",
                      "--storage", "nope://x", new_interpreter=True)  # fmt: skip
    assert forked.args == new.args
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        new.returncode, new.stdout, new.stderr)  # fmt: skip
    assert forked.returncode == 2 and forked.stderr.startswith("advisor: error: cannot open")


PROBE = "import sys; print(sys.argv[1:], sys.stdin.read()); sys.exit(int(sys.argv[1]))"


def test_a_python_probe_forked_and_in_a_new_interpreter_say_the_same() -> None:
    # OMP_NUM_THREADS is read at import: that probe runs in a new interpreter
    for env in (server_env(), server_env(OMP_NUM_THREADS="1")):
        run = python_code(PROBE, "3", "x", env=env)
        assert (run.returncode, run.stdout, run.stderr) == (3, "['3', 'x'] \n", "")
    crashed = python_code("1 / 0", env=server_env())
    assert crashed.returncode == 1 and crashed.stderr.rstrip().endswith("division by zero")
