"""benchmarks/process_spread.py: its config names the model, and its table counts the verdicts."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from advisor.config import load_config
from advisor.workload.rebuild import workload_from_info
from tests.conftest import load_script

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _script() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    return load_script(BENCH / "process_spread.py", "spread_under_test")


def test_its_config_rebuilds_the_model(tmp_path: Path) -> None:
    model = Path(__file__).resolve().parent / "data" / "relu_bn_block.py"
    cfg = load_config(_script()._config(model, "train", "cpu", tmp_path))
    assert cfg.mode == "train" and cfg.settings.label() == "default"
    assert workload_from_info(cfg.workload).make_model() is not None


def test_speedup_and_table() -> None:
    script = _script()
    steady = [10.0, 10.1, 9.9, 10.0, 10.2, 9.8]
    s, lo, hi = script._speedup({"samples_ms": steady}, {"samples_ms": [x / 2 for x in steady]})
    assert s == pytest.approx(2.0) and lo < 2.0 < hi
    runs = [
        {"speedup": 1.10, "low": 1.04, "high": 1.16},  # a win
        {"speedup": 0.98, "low": 0.94, "high": 1.04},  # undecided
        {"speedup": 0.90, "low": 0.85, "high": 0.95},  # a loss
    ]
    data = {"change": {"memory_format": "channels_last"}, "mode": "train", "device": "cpu",
            "runs": {"net": runs}}  # fmt: skip
    table = script.render(data, "today", "--models net")
    row = next(line for line in table.splitlines() if line.startswith("| net |"))
    assert "1.10 [1.04, 1.16], 0.98 [0.94, 1.04], 0.90 [0.85, 0.95]" in row
    assert "| 0.98x | 0.90-1.10x | 1 faster, 1 slower of 3 |" in row
