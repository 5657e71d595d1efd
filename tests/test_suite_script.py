"""benchmarks/suite.py: a quick CPU run end to end, the report and the conv roofline counts."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import FakeClock, load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "suite.py"


def _suite() -> ModuleType:
    return load_script(SCRIPT, "suite_under_test")  # puts benchmarks/ on sys.path for suite_models


def docs_smoke_run() -> list[str]:
    """The smoke run's arguments as docs/gpu-benchmarks.md shows them (its doc-test marker:
    run-by this test)."""
    for line in (ROOT / "docs" / "gpu-benchmarks.md").read_text().splitlines():
        if line.startswith("python benchmarks/suite.py --device cpu"):
            return shlex.split(line)[2:]
    raise AssertionError("docs/gpu-benchmarks.md shows no `python benchmarks/suite.py` smoke run")


@pytest.mark.slow
def test_quick_cpu_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "suite.md"
    args = docs_smoke_run()
    assert args[args.index("--out") + 1] == out.name and "seed_dwconvT_bn_b8" in args, args
    cmd = [sys.executable, str(SCRIPT), *args]  # --out suite.md: in tmp_path, its cwd
    # A verdict on completion, so a generous limit: about 1 minute alone here (20 s of it the bf16
    # peak on a CPU without bf16 units), 2 minutes beside two busy loops.
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert "## seed_dwconvT_bn_b8" in text and "## Summary" in text
    assert "| PyTorch default | `default` |" in text
    assert "| advisor's pick |" in text and "1.00x" in text
    data = json.loads(out.with_suffix(".json").read_text())
    (case,) = data["cases"]
    assert case["advise"]["grid"] >= case["advise"]["accepted"] > 0
    for name in ("default", "advisor"):
        # --min-samples (10), unless the time cap ran out first (a busy machine: its blocks are
        # slow) and the report says so; the loop itself is checked on a scripted clock below
        n = len(case["configs"][name]["samples_ms"])
        assert n >= 10 or f"only {n} samples: the time cap" in text, (name, n)
    # The exhaustive best is re-timed, or shown as the advisor's pick when they are the same.
    assert "samples_ms" in case["configs"]["exhaustive"] or case["configs"]["exhaustive"].get(
        "same_as_advisor"
    )
    merged = tmp_path / "merged.md"
    m = subprocess.run(
        [sys.executable, str(SCRIPT), "--merge", str(out.with_suffix(".json"))]
        + [str(out.with_suffix(".json")), "--out", str(merged)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert m.returncode == 0, m.stderr[-2000:]
    assert merged.read_text().count("## seed_dwconvT_bn_b8") == 2


def test_steps_are_sampled_until_there_are_enough_or_the_time_cap() -> None:
    import torch.utils.benchmark as tb

    suite = _suite()
    # 40 ms steps, min_run_time 50 ms: two blocks a call, so five calls (0.6 s) for ten samples
    clock = FakeClock([0.04])
    timer = tb.Timer(stmt="step()", globals={"step": clock.step}, timer=clock)
    assert suite.sample_steps(timer, 0.05, 10, clock) == pytest.approx([40.0] * 10)
    # 300 ms steps: one block a call; the cap (20 x 50 ms) stops it after two calls
    slow = FakeClock([0.3])
    timer = tb.Timer(stmt="step()", globals={"step": slow.step}, timer=slow)
    assert suite.sample_steps(timer, 0.05, 10, slow) == pytest.approx([300.0] * 2)
    # ...and the report says which configuration has fewer samples than asked for
    data = _report_data()
    data["cases"][0]["configs"]["default"]["samples_ms"] = [1.0] * 2
    assert "only 2 samples: the time cap (20 x min_run_time) ran out" in suite.render(data)


def _report_data() -> dict[str, Any]:
    """A quick CPU run's results, as the suite writes them: a failed advise, n/a and a failure."""
    return {
        "commands": ["python benchmarks/suite.py --device cpu"],
        "environment": {"device_type": "cpu", "device_name": "test CPU", "fingerprint": "x"},
        "peaks": {"fp32": {"flops_per_s": 1e11, "bytes_per_s": 1e10}},
        "options": {
            "space": "cpu",
            "advise_time": 5,
            "timing_cap": 0.05,
            "trials": None,
            "min_run_time": 0.05,
            "min_samples": 10,
            "rounds": 1,
            "compile_mode": "default",
            "quick": True,
        },
        "cases": [
            {
                "name": "c",
                "mode": "infer",
                "description": "a case",
                "inputs": [[1, 3, 8, 8]],
                "floor_ms": {"fp32": 0.5},
                "advise": {"error": "RuntimeError: boom"},
                "configs": {
                    "default": {"samples_ms": [1.0] * 10, "first_call_s": 0.01, "label": "default"},
                    "cudnn_benchmark": {"na": "CUDA only"},
                    "compile": {"error": "timed out after 300 s"},
                    "advisor": {"error": "advise failed: RuntimeError: boom"},
                },
            },
            {"name": "tv", "mode": "train", "description": "d", "configs": {}, "skipped": "skip"},
        ],
    }


def test_report_shows_failures_and_not_applicable() -> None:
    text = _suite().render(_report_data())
    assert "| PyTorch default | `default` | 1.000 (0.000) | - |" in text
    assert "50% (fp32)" in text  # floor 0.5 ms over 1 ms
    assert "| cudnn.benchmark alone | | n/a |" in text and "timed out after 300 s" in text
    assert "Advisor failed: RuntimeError: boom" in text
    assert "| tv | skip |" in text


def test_conv_stats_count_every_conv_call() -> None:
    suite = _suite()
    from suite_models import BY_NAME

    stats = suite.conv_stats(BY_NAME["unet_decoder_train"], quick=True)
    assert len(stats) == 4 + 4 * 2 + 1  # per stage a ConvTranspose2d and two 3x3 convs; a head
    (one,) = suite.conv_stats(BY_NAME["seed_conv2d_3to16_infer"], quick=True)
    assert one[0] == 2 * 16 * 128 * 128 * 3 * 9  # forward FLOPs of Conv2d(3, 16, 3) on 128x128
    assert one[2] < one[1]  # half-precision bytes
