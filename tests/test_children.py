"""advisor.execute.children: a child forked from the server starts as a spawned one would, from
its parent's environment and stderr, and costs no import of torch."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from multiprocessing.connection import Connection

import pytest

from advisor.execute import children
from tests.conftest import run_env

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the fork server is Linux-only")


def _report(conn: Connection, name: str) -> None:
    """In the child: the variable asked for, whether torch is imported, and a line on stdout;
    how many objects are frozen out of the garbage collector, and whether it collects."""
    print(f"child says hello on stdout ({os.getpid()})", flush=True)
    conn.send((os.environ.get(name), "torch" in sys.modules, os.getcwd(), gc.get_freeze_count(),
               gc.isenabled()))  # fmt: skip
    conn.close()


def _run_child(name: str) -> tuple[str | None, bool, str, int, bool]:
    proc, conn = children.start_child(_report, name)
    try:
        assert conn.poll(120), "the child did not answer"
        return conn.recv()
    finally:
        proc.join(10)
        conn.close()


@linux_only
def test_a_forked_child_gets_the_parents_environment_and_folder_as_they_are_now(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    children.start_server()
    monkeypatch.setenv("ADVISOR_TEST_LATE", "set after the server started")
    monkeypatch.chdir(tmp_path)
    assert children.start_method() == "forkserver"
    value, has_torch, cwd, frozen, collects = _run_child("ADVISOR_TEST_LATE")
    assert value == "set after the server started"
    assert has_torch  # imported by the server, not by the child
    assert frozen > 50_000 and collects  # torch's objects: no collection in the child walks them
    # ...nor in the server, whose exit the parent's exit waits for: it freezes after its imports
    assert children.PRELOAD[-1] == "advisor.execute.preloaded"
    assert os.path.samefile(cwd, tmp_path)


@linux_only
def test_a_variable_torch_reads_at_import_that_changed_means_a_spawned_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    children.start_server()
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2")
    assert children.start_method() == "spawn"
    value, *_ = _run_child("OMP_NUM_THREADS")
    assert value == os.environ["OMP_NUM_THREADS"]


def test_spawn_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(children.METHOD_ENV, "spawn")
    assert children.start_method() == "spawn"
    value, has_torch, _, frozen, collects = _run_child(children.METHOD_ENV)
    assert value == "spawn" and has_torch  # the child's code imports it (the advisor does)
    assert frozen > 50_000 and collects


@linux_only
@pytest.mark.parametrize("fork", [False, True], ids=["spawned_server", "forked_server"])
def test_a_forked_childs_stdout_is_its_parents_stderr_and_the_server_ends_with_its_parent(
    fork: bool,
) -> None:
    """Run in a fresh interpreter so the pipes are this test's: the child's print lands on the
    parent's stderr, never its stdout (which may carry JSON); the server is gone once the
    parent has exited. The command's server (`fork`) is this process forked: its stdout is the
    parent's stderr too, and it holds none of the parent's other files (a pipe it held would
    not reach its end when the parent exits); multiprocessing's resource tracker, started with
    it, is spawned as always. The forked server imports without collections; its children
    collect."""
    code = textwrap.dedent(
        f"""
        import os, sys
        from advisor.execute import children
        from tests.test_children import _run_child
        from multiprocessing import forkserver
        from multiprocessing import resource_tracker
        children.start_server(fork={fork})
        server = forkserver._forkserver._forkserver_pid
        tracker = resource_tracker._resource_tracker._pid  # started beside it, never forked
        assert "resource_tracker" in open(f"/proc/{{tracker}}/cmdline").read()
        _, torch_there, _, _, collects = _run_child("HOME")  # the server serves: set up
        assert collects
        named = open(f"/proc/{{server}}/cmdline").read() == open("/proc/self/cmdline").read()
        fds = {{int(fd): os.readlink(f"/proc/{{server}}/fd/{{fd}}")
               for fd in os.listdir(f"/proc/{{server}}/fd")}}
        print(children.start_method(), torch_there, server, named,
              fds[1] == os.readlink("/proc/self/fd/2"),
              os.readlink("/proc/self/fd/1") not in fds.values())
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=run_env(), check=True)  # fmt: skip
    method, torch_there, server, forked, out_is_err, no_stdout = done.stdout.split()
    assert (method, torch_there, forked) == ("forkserver", "True", str(fork))
    assert (out_is_err, no_stdout) == ("True", "True")
    assert "child says hello on stdout" in done.stderr and "resource_tracker" not in done.stderr
    assert not os.path.exists(f"/proc/{server}")  # stopped and reaped at exit: nothing left


@pytest.mark.parametrize(
    ("args", "starts"),
    [
        (["advise", "--layer", "x"], True),
        (["worker"], True),
        (["advise", "--in-process"], False),
        (["show", "tuned.json"], False),
    ],
)
def test_the_cli_forks_the_server_only_for_commands_that_start_children(
    monkeypatch: pytest.MonkeyPatch, args: list[str], starts: bool
) -> None:
    started: list[bool] = []
    monkeypatch.setattr(children, "start_server", lambda fork=False: started.append(fork))
    children.start_for_cli(args)
    assert started == ([True] if starts else [])
