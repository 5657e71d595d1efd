"""Ctrl-C before any answer was written: one line that says what was kept, exit 130.

With `--storage memory` nothing outlives the run, so the line must not say the study is stored
(an H200 run of issue 55's acceptance script printed "the study is stored: run the same command
to resume" for a quick run with `--storage memory`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import DATA, FAST_SPACE, run_env
from tests.test_effort import _ctrl_c_as_at_a_terminal


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT: POSIX")
def test_ctrl_c_during_the_search_with_memory_storage_says_nothing_was_kept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tuned.json"
    p = subprocess.Popen(
        [sys.executable, "-m", "advisor", "advise", str(DATA / "tiny_cnn.py"), "--mode", "train",
         "--device", "cpu", "--space", str(FAST_SPACE), "--storage", "memory", "--effort",
         "quick", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(), cwd=tmp_path,
        start_new_session=True, preexec_fn=_ctrl_c_as_at_a_terminal,
    )  # fmt: skip
    lines: list[str] = []
    loaded = threading.Event()

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line)
            if "start-up and load" in line:
                loaded.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    while not loaded.wait(0.05) and p.poll() is None and time.monotonic() < start + 120:
        pass
    assert loaded.is_set(), "".join(lines)[-2000:]
    os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C, in the search
    p.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(lines)
    assert p.returncode == 130, err[-2500:]
    if "Traceback" in err or not any("interrupted" in ln for ln in lines):
        pytest.fail(err[-2500:])
    last = [ln for ln in lines if ln.startswith("advisor: interrupted")]
    assert len(last) == 1 and "nothing was kept (--storage memory)" in last[0], err[-2500:]
    assert "study is stored" not in err
    assert not out.exists()  # no half-written answer
