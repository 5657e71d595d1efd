"""stdout carries machine-readable output only (`advisor advise --json`): while the user's code
runs (a model file's import, its factories, its forward; in this process or in the worker
processes started meanwhile), whatever it prints goes to stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = ["fd_stdout_to_stderr", "stdout_to_stderr"]


def _flush() -> None:
    for stream in (sys.stdout, sys.__stdout__):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()


@contextlib.contextmanager
def fd_stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 points at stderr for the duration: C-level writes to stdout, and the
    stdout of processes started meanwhile (they inherit it), go to stderr. Restored after; a
    no-op where the descriptors cannot be duplicated."""
    _flush()  # what was printed before goes where it was meant to
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        yield
    finally:
        _flush()  # buffered while redirected: goes to stderr, as it was written then
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Everything this process (and the processes it starts) prints to stdout goes to stderr
    for the duration: Python's `print` (sys.stdout) and C-level writes alike."""
    with fd_stdout_to_stderr():
        if sys.stderr is None:
            yield
            return
        with contextlib.redirect_stdout(sys.stderr):
            yield
