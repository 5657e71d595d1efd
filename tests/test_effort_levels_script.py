"""benchmarks/effort_levels.py: its table from rows (a real run of the script is a benchmark)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "effort_levels.py"


def test_the_table_shows_each_level_and_the_reuse_ratio() -> None:
    script = load_script(SCRIPT, "effort_levels_under_test")
    args = argparse.Namespace(model="m.py", mode="train", device="cpu")
    rows = [
        {"effort": "quick", "wall_s": 8.0, "eager_s": None, "pick": "amp=bf16", "speedup": 1.5,
         "speedup_ci": [1.4, 1.6], "final_check": None, "less_cold_s": 6.0, "harness": 0.8,
         "candidates": 6, "candidate_wall_s": 0.5, "stage_s": {"total": 6.0}},
        {"effort": "default", "wall_s": 30.0, "eager_s": 12.0, "pick": "amp=bf16",
         "speedup": 1.6, "speedup_ci": [1.5, 1.7], "final_check": True, "less_cold_s": 20.0,
         "harness": 0.9, "candidates": 8, "candidate_wall_s": 0.7, "stage_s": {"total": 29.0}},
        {"effort": "full", "wall_s": 3.0, "error": "advisor: error: boom"},
    ]  # fmt: skip
    reuse = [{"wall_s": 30.0, "pick": "amp=bf16"}, {"wall_s": 3.0, "pick": "amp=bf16"}]
    text = script.report(rows, reuse, "Machine: m", args)
    assert "| quick | 8.0 | - | 6.0 | 80% | 6 | 0.50 | `amp=bf16` | 1.50x [1.40, 1.60] | none |" in text
    assert "| default | 30.0 | 12.0 | 20.0 | 90% | 8 | 0.70 | `amp=bf16` | 1.60x [1.50, 1.70] | held |" in text
    assert "error: advisor: error: boom" in text
    assert "Second / first: 10%." in text


def test_default_after_quick_is_shown_beside_default_alone() -> None:
    """The --after-quick section: default alone (the table's row), then quick and default in
    one cache folder, each with its global knobs and their precision checks."""
    script = load_script(SCRIPT, "effort_levels_after_quick")
    args = argparse.Namespace(model="m.py", mode="train", device="cpu")
    knobs = "global knobs: precision checks"
    alone = {"effort": "default", "wall_s": 30.0, "pick": "amp=bf16",
             "stage_s": {"global knobs": 7.0, knobs: 1.5, "total": 29.0}}
    after = [{"effort": "quick", "wall_s": 9.0, "pick": "amp=bf16",
              "stage_s": {"global knobs": 6.5, knobs: 1.6, "total": 8.0}},
             {"effort": "default", "wall_s": 28.0, "pick": "amp=bf16",
              "stage_s": {"global knobs": 5.4, "total": 27.0}}]  # fmt: skip
    text = script.report([alone], [], "Machine: m", args, after)
    assert "| default alone | 30.0 | 7.0 | 1.5 | `amp=bf16` |" in text
    assert "| quick | 9.0 | 6.5 | 1.6 | `amp=bf16` |" in text
    assert "| default (after quick) | 28.0 | 5.4 | 0.0 | `amp=bf16` |" in text
    assert "Default after quick" not in script.report([alone], [], "Machine: m", args)

