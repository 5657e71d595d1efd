"""benchmarks/check_cost.py: the fp32 side of the training check, timed, and its band runs."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "check_cost.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "check_cost_under_test")


@pytest.mark.slow  # the script's precision checks (1.4 s quiet, 39 s on a busy machine)
def test_a_row_per_draw_with_each_band_runs_gap_and_the_widest(tmp_path: Path) -> None:
    out = tmp_path / "cost.md"
    assert _script().main(["relu_bn_block", "--seeds", "1", "--batch-runs", "2",
                           "--out", str(out)]) == 0  # fmt: skip
    text = out.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| model"))
    assert "fp32 jittered 1 | fp32 other batches 1 | fp32 other batches 2" in header
    (row,) = [line for line in text.splitlines() if line.startswith("| relu_bn_block")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    gaps = [float(c.rstrip("%")) for c in cells[4:7]]
    assert float(cells[2]) > 0 and all(g >= 0 for g in gaps)
    assert (
        cells[7]
        == ["fp32 jittered 1", "fp32 other batches 1", "fp32 other batches 2"][
            gaps.index(max(gaps))
        ]
    )


def test_an_unknown_model_is_one_line_and_exit_2(capsys) -> None:  # noqa: ANN001
    assert _script().main(["no_such_net"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model" in err[0]
