"""Running `python -m advisor ...` as a user does, and what a one-line error must look like.

Starting the command costs an interpreter and torch's import (about 1.5 s of CPU on a 2-core
machine), and the tests run it over a hundred times. Where the environment asked for differs
from the fork server's in nothing read at import (`advisor.execute.children.IMPORT_TIME_ENV`, and
the variables the advisor reads as its package loads), `advisor_cli` forks the command from the
advisor's own fork server instead: a process that has imported torch and run nothing (no tensor,
no thread pool), as fresh as a new interpreter less the import, as the advisor starts its own
children. The command's stdin is /dev/null, its stdout and stderr are files read back when it
ends, and its exit code is its own (minus the signal's number where one ended it, as
`subprocess` says). Otherwise it runs as a new interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from advisor.execute import children
from advisor.execute.worker_process import main_hidden
from tests.conftest import run_env

ROOT = Path(__file__).resolve().parent.parent
# What the advisor package reads as it is imported, not as a command runs.
_READ_AT_IMPORT = ("ADVISOR_PROFILE_DIR", "ADVISOR_PLUGINS", children.METHOD_ENV)


def advisor_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    new_interpreter: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -m advisor *args` in `cwd` (default: the repository), with `run_env()` and `env`
    over it; its stdout and stderr as text. `new_interpreter`: never forked (the test reads the
    interpreter's own start)."""
    full = {**run_env(), **(env or {})}
    argv = [sys.executable, "-m", "advisor", *args]
    folder = str(cwd or ROOT)
    if new_interpreter or not _forkable(full):
        return subprocess.run(argv, capture_output=True, text=True, env=full, cwd=folder,
                              timeout=timeout)  # fmt: skip
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = children.context().Process(
            target=_command,
            args=(list(args), full, folder, children.Fd(out.fileno()), children.Fd(err.fileno())),
        )
        with main_hidden():
            proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
        return subprocess.CompletedProcess(argv, proc.exitcode, texts[0], texts[1])


def _forkable(env: dict[str, str]) -> bool:
    """Whether a command with `env` can be forked from the fork server: children are forked
    here, and nothing read at import differs from the server's environment (PYTHONPATH's entries
    being on the server's path already)."""
    server = children._server_env
    if server is None or children.start_method() != "forkserver":
        return False
    for key in set(env) | set(server):
        if env.get(key) == server.get(key):
            continue
        if key == "PYTHONPATH":
            if all(not p or p in sys.path for p in env[key].split(os.pathsep)):
                continue
            return False
        if key.startswith(children.IMPORT_TIME_ENV) or key in _READ_AT_IMPORT:
            return False
    return True


def _command(args: list[str], env: dict[str, str], cwd: str, out: int, err: int) -> None:
    """The forked command: its streams, environment, folder and arguments, then the `advisor`
    command's entry point, which ends the process with the command's exit code."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [str(ROOT / "advisor" / "__main__.py"), *args]
    from advisor.cli import run

    run()


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
