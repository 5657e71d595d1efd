"""Peak memory per candidate, --max-memory, and the time,memory Pareto set.

The layer's output (3x48x256x256 fp32, 36 MiB) is above glibc's largest mmap threshold, so every
step maps fresh pages and the resident-memory growth is visible on CPU in every trial.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest
import torch

import advisor
from tests._cli import advisor_cli
from tests.conftest import DATA, in_fresh_process

SPACE = str(DATA / "memory_cpu.yaml")
LAYER = {"layer": "Conv2d(3, 48, 3, padding=1)", "input_shape": "3,3,256,256"}
OUTPUT_MB = 3 * 48 * 256 * 256 * 4 / 2**20


def _dominates(a: pd.Series, b: pd.Series) -> bool:
    at, am, bt, bm = a.median_ms, a.peak_memory_mb, b.median_ms, b.peak_memory_mb
    return at <= bt and am <= bm and (at < bt or am < bm)


@pytest.mark.slow  # an isolated time,memory run (6 s); the limit: test_max_memory_...
def test_isolated_peaks_and_the_pareto_set_in_the_trials_csv(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    r = advisor_cli("advise", "--layer", LAYER["layer"], "--input-shape", LAYER["input_shape"],
                    "--device", "cpu", "--space", SPACE, "--objectives", "time,memory",
                    "--storage", "memory", "--out", str(out), "--quiet", timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "tuned.trials.csv")
    assert len(df) == 4 and (df["status"] == "ok").all()
    # Measured in the worker subprocess: each candidate's own peak, at least its output.
    assert (df["peak_memory_mb"] > 0.9 * OUTPUT_MB).all(), df["peak_memory_mb"]
    front = df[df["pareto"]]
    rest = df[~df["pareto"]]
    assert len(front) >= 1
    for _, p in front.iterrows():  # no member of the set is beaten on both objectives...
        assert not any(_dominates(o, p) for _, o in df.iterrows())
    for _, x in rest.iterrows():  # ...and every other candidate is
        assert any(_dominates(p, x) for _, p in front.iterrows())


def test_max_memory_rejects_candidates_but_keeps_the_baseline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kw = dict(LAYER, device="cpu", space=SPACE, storage=str(tmp_path / "s.log"), study_name="m")
    free = advisor.advise(**kw)
    assert (free.trials["status"] == "ok").all()
    with caplog.at_level(logging.WARNING, logger="advisor"):
        limited = advisor.advise(**kw, max_memory_mb=1.0)  # the same study, measured once
    df = limited.trials.set_index("label")
    assert df["median_ms"].tolist() == free.trials["median_ms"].tolist()  # not measured again
    assert df.loc["default", "status"] == "ok"  # the baseline is the yardstick: always kept
    others = df.drop(index="default")
    assert (others["status"] == "rejected").all()
    assert others["reason"].str.contains("over the --max-memory limit of 1 MB").all()
    assert limited.settings == advisor.Settings()
    assert "PyTorch's default peaks at" in caplog.text and "over --max-memory 1 MB" in caplog.text


def test_in_process_peaks_survive_a_fragmented_heap(tmp_path: Path) -> None:
    """A long-lived process (a notebook, a training script) has resident free memory in its heap;
    a candidate's buffers can land there without growing the RSS. Each peak must still show.
    In a fresh process that makes the fragmentation itself: the test runner's own heap holds
    other tests' garbage, which a collection during a trial frees where a buffer lands unseen."""
    in_fresh_process(peaks_in_a_fragmented_heap, str(tmp_path), timeout_s=120)


def peaks_in_a_fragmented_heap(folder: str) -> None:
    """The body of the test above."""
    blocks = [torch.empty(100_000, dtype=torch.uint8).fill_(1) for _ in range(2000)]  # ~200 MB
    # Fresh blocks of the same size come from above them, so the heap top is not trimmed.
    keep = [torch.empty(100_000, dtype=torch.uint8).fill_(1) for _ in range(10)]
    del blocks
    kw = dict(LAYER, device="cpu", space=SPACE, storage=str(Path(folder) / "s.log"), study_name="f")
    df = advisor.advise(**kw).trials
    assert (df["peak_memory_mb"] > 0.9 * OUTPUT_MB).all(), df[["label", "peak_memory_mb"]]
    del keep
