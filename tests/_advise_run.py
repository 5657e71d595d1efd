"""`advisor advise` as a terminal's foreground job, for the Ctrl-C tests: its own process group,
SIGINT at its default action, stderr read as it comes (a pipe left full would stall the run's
prints)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import run_env


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT's default action in the child, as a terminal's foreground job has it: a test run
    started in the background by a non-interactive shell (`cmd &`) has SIGINT ignored, every
    process under it inherits that across exec, and Python then installs no handler, so the
    advise process would never see the Ctrl-C (it failed 2 of 6 such CI runs)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class AdviseRun:
    """`python -m advisor advise *args` in `cwd`, its stderr lines gathered in `lines`."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "advisor", "advise", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(), cwd=cwd,
            start_new_session=True, preexec_fn=_ctrl_c_as_at_a_terminal,
        )  # fmt: skip
        self.lines: list[str] = []
        self._marker: str | None = None
        self._seen = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if self._marker is not None and self._marker in line:
                self._seen.set()

    def wait_for(self, marker: str, timeout_s: float = 120) -> float | None:
        """Seconds until a stderr line held `marker` (None: it ended or timed out first)."""
        self._marker = marker
        if any(marker in line for line in self.lines):
            self._seen.set()
        start = time.monotonic()
        while not self._seen.wait(0.05) and self.proc.poll() is None:
            if time.monotonic() > start + timeout_s:
                break
        return time.monotonic() - start if self._seen.is_set() else None

    def ctrl_c(self, timeout_s: float = 120) -> int:
        """A terminal's Ctrl-C, to the whole foreground group; the run's exit code."""
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return self.proc.returncode

    @property
    def err(self) -> str:
        return "".join(self.lines)
