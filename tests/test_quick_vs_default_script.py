"""benchmarks/quick_vs_default.py: its verdicts and table from rows (a real run is a benchmark)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "quick_vs_default.py"


def _run(wall: float, pick: str, settings: dict[str, str], **extra: object) -> dict[str, object]:
    return {"wall_s": wall, "pick": pick, "settings": settings, "less_cold_s": wall - 5,
            "harness": 0.8, "eager_s": None, "stage_s": {"total": wall - 1}, **extra}  # fmt: skip


def test_quick_is_compared_with_default_only_where_their_picks_differ() -> None:
    script = load_script(SCRIPT, "quick_vs_default_under_test")
    q = _run(9.0, "amp=bf16", {"amp": "bf16"})
    same = script.compare(Path("unused.json"), q, _run(30.0, "amp=bf16", {"amp": "bf16"}),
                          argparse.Namespace())  # fmt: skip
    assert same == {"same": True}
    assert script.verdict(same) == "same pick"
    # default pick's time / quick pick's: 0.96x is within 5% (1/1.05 = 0.952), 0.94x is not
    assert script.verdict({"ratio": [0.96, 0.9, 1.0]}) == "0.96x [0.90, 1.00]: within 5%"
    assert script.verdict({"ratio": [0.94, 0.9, 0.98]}).endswith("NOT within 5%")
    assert script.verdict({"error": "boom"}) == "re-time failed: boom"


def test_the_table_has_a_row_per_model_and_the_default_runs_total() -> None:
    script = load_script(SCRIPT, "quick_vs_default_under_test")
    rows = [
        {"model": "a", "quick": _run(10.0, "amp=bf16", {"amp": "bf16"}),
         "default": _run(30.0, "amp=bf16", {"amp": "bf16"}, eager_s=15.0),
         "compare": {"same": True}},
        {"model": "b", "quick": _run(12.0, "default", {}),
         "default": _run(40.0, "memory_format=channels_last", {"memory_format": "channels_last"}),
         "compare": {"ratio": [0.9, 0.85, 0.95]}},
        {"model": "d", "quick": _run(12.0, "default", {}),
         "default": _run(80.0, "default", {}, gate_compiles_s=20.0), "compare": {"same": True}},
        {"model": "c", "quick": {"wall_s": 3.0, "error": "advisor: error: boom"},
         "default": {"wall_s": 0.0, "error": "not run"}},
    ]  # fmt: skip
    text = script.report(rows, "Machine: m")
    assert "| a | 10.0 | 30.0 | 25.0 | 15.0 | 80% | `amp=bf16` | `amp=bf16` | same pick |" in text
    assert "| b | 12.0 | 40.0 | 35.0 | - | 80% | `default` | `memory_format=channels_last` | " \
           "0.90x [0.85, 0.95]: NOT within 5% |" in text  # fmt: skip
    assert "| d | 12.0 | 80.0 | 75.0 (55.0) | - |" in text  # less the gate's compiles too
    assert "error: advisor: error: boom" in text
    assert "all models together: 135.0 s; quick, all together: 34.0 s." in text
