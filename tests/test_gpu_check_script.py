"""benchmarks/gpu_check.py: one line and exit code 2 without a GPU; its report's shape."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def test_without_a_gpu_it_says_so_in_one_line() -> None:
    if torch.cuda.is_available():
        return  # on a GPU machine the script runs for minutes: benchmarks, not a unit test
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no CUDA device" in r.stderr
    assert r.stdout == ""


def test_the_report_names_the_environment_and_every_step() -> None:
    mod = load_script(SCRIPT, "gpu_check_under_test")
    env = {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gb": 79.1,
           "driver": "580.1", "cuda": "13.0", "cudnn": 91000, "torch": "2.11.0",
           "triton": "3.6.0", "python": "3.12.3"}  # fmt: skip
    steps = [
        {"step": "CLI", "status": "ok", "seconds": 41.0, "stdout": "Wrote t.json", "stderr": ""},
        {"step": "suite", "status": "not run: the deadline", "seconds": 0.0, "stdout": "",
         "stderr": ""},
    ]  # fmt: skip
    text = mod.render({"environment": env, "steps": steps, "command": "python x", "date": "d",
                       "seconds": 41.0})  # fmt: skip
    assert "# GPU check: NVIDIA H100 80GB HBM3" in text
    assert (
        "| NVIDIA H100 80GB HBM3 | 9.0 | 79.1 GB | 580.1 | 13.0 | 91000 | 2.11.0 | 3.6.0 |" in text
    )
    assert "| CLI | ok | 41 |" in text and "| suite | not run: the deadline | 0 |" in text
    assert "Wrote t.json" in text
