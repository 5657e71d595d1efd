"""Ctrl-C before any answer was written: one line that says what was kept, exit 130.

With `--storage memory` nothing outlives the run, so the line must not say the study is stored
(an H200 run of issue 55's acceptance script printed "the study is stored: run the same command
to resume" for a quick run with `--storage memory`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests._advise_run import AdviseRun
from tests.conftest import DATA, FAST_SPACE


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT: POSIX")
def test_ctrl_c_during_the_search_with_memory_storage_says_nothing_was_kept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tuned.json"
    run = AdviseRun([str(DATA / "tiny_cnn.py"), "--mode", "train", "--device", "cpu", "--space",
                     str(FAST_SPACE), "--storage", "memory", "--effort", "quick", "--out",
                     str(out)], tmp_path)  # fmt: skip
    assert run.wait_for("start-up and load") is not None, run.err[-2000:]
    code = run.ctrl_c()  # in the search
    err, lines = run.err, run.lines
    assert code == 130, err[-2500:]
    if "Traceback" in err or not any("interrupted" in ln for ln in lines):
        pytest.fail(err[-2500:])
    last = [ln for ln in lines if ln.startswith("advisor: interrupted")]
    assert len(last) == 1 and "nothing was kept (--storage memory)" in last[0], err[-2500:]
    assert "study is stored" not in err
    assert not out.exists()  # no half-written answer
