"""What the user sees at the end of `advise`: the summary tables, and --quiet/--json streams."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from rich.console import Console

import advisor
from advisor.report.progress import failure_kind, summary_tables
from tests.conftest import run_env
from tests.test_report import strict_bf16_space

if TYPE_CHECKING:
    from advisor.advice import Advice


@pytest.fixture(scope="module")
def advice(tmp_path_factory: pytest.TempPathFactory) -> Advice:
    folder = tmp_path_factory.mktemp("progress")
    return advisor.advise(
        layer="Conv2d(3, 8, 3, padding=1)",
        input_shape="1,3,24,24",
        device="cpu",
        mode="infer",
        space=strict_bf16_space(folder),
    )


def render(advice: Advice) -> str:
    console = Console(record=True, width=200)
    for table in summary_tables(advice):
        console.print(table)
    return console.export_text()


def test_summary_tables_show_baseline_singles_and_rejections(advice: Advice) -> None:
    text = render(advice)
    r = advice.config.result
    assert r is not None
    assert "PyTorch default" in text and "recommended" in text
    assert f"{r.speedup:.2f}x [{r.speedup_ci[0]:.2f}, {r.speedup_ci[1]:.2f}]" in text
    assert "Each single change from the default" in text
    assert "memory_format=channels_last" in text and "amp=bf16" in text
    assert "vs default [95% CI]" in text
    assert "Rejected or failed candidates" in text and "error too high" in text
    assert "over the bf16 layer tolerance" in text  # the reason, verbatim


@pytest.mark.parametrize(
    "status,reason,kind",
    [
        ("rejected", "error 2.79e-03 over the bf16 tolerance 1e-12", "error too high"),
        ("rejected", "NaN or Inf in outputs or gradients", "NaN/Inf in results"),
        ("rejected", "peak memory 900 MB over the --max-memory limit of 100 MB", "over the memory"),
        ("failed", "out of memory", "out of memory"),
        ("failed", "out of memory (CUDA out of memory. Tried to allocate 2 GiB)", "out of memory"),
        ("failed", "worker crashed (SIGKILL): killed, possibly by the out-of-memory killer", "out"),
        ("failed", "worker crashed (SIGSEGV)", "crashed"),
        ("failed", "worker exited with code 1", "crashed"),
        ("failed", "timed out after 600 s (killed)", "timed out"),
        ("failed", "RuntimeError: no kernel image", "raised an error"),
        ("ok", "", ""),
    ],
)
def test_failure_kind(status: str, reason: str, kind: str) -> None:
    assert failure_kind(status, reason).startswith(kind)


def test_quiet_json_prints_only_the_config(tmp_path: Path, fast_space: str) -> None:
    out = tmp_path / "t.json"
    r = subprocess.run(
        [sys.executable, "-m", "advisor", "advise", "--layer", "Conv2d(3, 4, 3)",
         "--input-shape", "1,3,16,16", "--device", "cpu", "--space", fast_space,
         "--storage", "memory", "--in-process", "--out", str(out), "--quiet", "--json"],
        capture_output=True, text=True, env=run_env(), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress bar, no table
    assert json.loads(r.stdout) == json.loads(out.read_text())
