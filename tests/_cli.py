"""Fresh processes for the tests: `python -m advisor ...` as a user runs it, a test body away
from the runner's history, a `python -c` probe, and what a one-line error must look like.

A new interpreter costs its start and torch's import (about 1.5 s of CPU on a 2-core machine),
and the tests start over a hundred. Where the environment asked for differs from the fork
server's in nothing read at import (the advisor's rule for its own children,
`advisor.execute.children.start_method`, and what the advisor reads as its package loads),
`fresh_process` forks the process from the advisor's own fork server instead: a process that has
imported torch and run nothing (no tensor, no thread pool), as fresh as a new interpreter less
the import, as the advisor starts its own children. Its stdin is /dev/null, its stdout and
stderr are files read back when it ends, and its exit code is its own (minus the signal's number
where one ended it, as `subprocess` says). Otherwise the callers start a new interpreter.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.execute import children
from advisor.execute.worker_process import main_hidden

ROOT = Path(__file__).resolve().parent.parent
# What the advisor package reads as it is imported, not as a command runs.
_READ_AT_IMPORT = ("ADVISOR_PROFILE_DIR", "ADVISOR_PLUGINS", children.METHOD_ENV)


def run_env() -> dict[str, str]:
    """Environment for subprocesses: the repository importable, the temporary cache kept."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


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
    folder = cwd or ROOT
    forked = None if new_interpreter else fresh_process(_command, list(args), env=full,
                                                        cwd=folder, timeout=timeout)  # fmt: skip
    if forked is not None:
        forked.args = argv
        return forked
    return subprocess.run(argv, capture_output=True, text=True, env=full, cwd=folder,
                          timeout=timeout)  # fmt: skip


def fresh_process(
    target: Callable[..., None],
    *args: Any,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str] | None:
    """`target(*args)` (a module-level function) in a process forked from the fork server, with
    environment `env` (default: `run_env()`) and folder `cwd`; its exit code (a function that
    returns: 0; a signal: minus its number), stdout and stderr. None where it cannot be forked
    (`_forkable`): the caller starts a new interpreter."""
    env = run_env() if env is None else env
    if not _forkable(env):
        return None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = children.context().Process(
            target=_forked,
            args=(target, args, env, str(cwd or ROOT), children.Fd(out.fileno()),
                  children.Fd(err.fileno())),  # fmt: skip
        )
        with main_hidden():
            proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([target.__name__], timeout)
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
        return subprocess.CompletedProcess([target.__name__], proc.exitcode, texts[0], texts[1])


def _forkable(env: dict[str, str]) -> bool:
    """Whether a process with `env` can be forked from the fork server: the advisor's rule for
    its own children (`children.start_method`) on `env`, not on this process's environment (a
    library can set a variable read at import as it is imported, as scikit-learn sets `KMP_*`),
    and `import_time_changes`'s two additions."""
    return children.start_method(_as_read(env)) == "forkserver" and not import_time_changes(env)


def import_time_changes(env: dict[str, str]) -> list[str]:
    """The variables read at import whose value in `env` differs from the fork server's: the
    advisor's rule (`children.changed_at_import`), less PYTHONPATH where its folders are all on
    the server's path already, plus what the advisor package reads as it loads."""
    server = children._server_env or {}
    ours = [k for k in _READ_AT_IMPORT if env.get(k) != server.get(k)]
    return sorted(children.changed_at_import(_as_read(env)) + ours)


def _as_read(env: dict[str, str]) -> dict[str, str]:
    """`env` as torch's import in the server reads it: the server's PYTHONPATH where every
    folder `env`'s names is on this process's path already, which the server has."""
    if any(p and p not in sys.path for p in env.get("PYTHONPATH", "").split(os.pathsep)):
        return env
    same = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    server = children._server_env or {}
    return same | ({"PYTHONPATH": server["PYTHONPATH"]} if "PYTHONPATH" in server else {})


def _forked(target: Callable[..., None], args: tuple[Any, ...], env: dict[str, str], cwd: str,
            out: int, err: int) -> None:  # fmt: skip
    """The forked process: its streams (stdin /dev/null), environment and folder; then
    `target(*args)`."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, into in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, into)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    target(*args)


def _command(args: list[str]) -> None:
    """The `advisor` command's entry point with `args`: it ends the process with the command's
    exit code."""
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


def many(cases_json: str) -> None:
    """Many bad-input cases in one process: each is `advisor.cli.main(argv)` with its own stdout
    and stderr captured and its exit code kept; an exception that escapes main is reported as
    the traceback it would print. What a user's shell sees, at one process start for all cases.
    Prints {name: [code, stdout, stderr]} as JSON."""
    import advisor.cli

    out = {}
    for name, argv in json.loads(cases_json).items():
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


def advisor_cli_many(
    cases: dict[str, list[str]], cwd: Path | None = None, timeout: float = 600
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run each case's argv through the CLI's `main` in one fresh process (`many`)."""
    r = python_code("import sys; from tests._cli import many; many(sys.argv[1])",
                    json.dumps(cases), cwd=cwd, timeout=timeout)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return {
        name: subprocess.CompletedProcess(cases[name], code, stdout, stderr)
        for name, (code, stdout, stderr) in json.loads(r.stdout).items()
    }


def python_code(code: str, *argv: str, env: dict[str, str] | None = None,
                cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`python -X faulthandler -c code *argv` in `cwd` (default: the repository), forked where
    it can be (`fresh_process`), else in a new interpreter. A module the fork server imported (`children.PRELOAD`) is there
    already, so a check that an import leaves a module out holds only for modules the server
    leaves out too; and a forked process leaves without running its exit handlers."""
    run = fresh_process(_code, code, argv, env=env, cwd=cwd, timeout=timeout)
    if run is None:
        run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *argv],
                             env=run_env() if env is None else env, cwd=cwd or ROOT,
                             capture_output=True, text=True, timeout=timeout)  # fmt: skip
    return run


def _code(code: str, argv: tuple[str, ...]) -> None:
    """`code` as `python -c` runs it, with a crash's stack on stderr."""
    faulthandler.enable()
    sys.argv = ["-c", *argv]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
