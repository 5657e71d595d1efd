"""Item 7: outputs are checked before the search (a bad --out is found at once, naming the file),
and the config and its CSVs are written all or none."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._cli import advisor_cli, one_line_error

# A model whose import leaves a mark: the search (which loads the model) never started if the mark
# is absent.
MARKING_MODEL = """
import os
from pathlib import Path
import torch
from torch import nn

Path(os.environ["ADVISOR_TEST_MARK"]).write_text("loaded")


def build_model():
    return nn.Conv2d(3, 4, 3)


def example_inputs():
    return (torch.randn(1, 3, 8, 8),)
"""


def _advise(tmp_path: Path, out: Path, fast_space: str):  # noqa: ANN202
    model = tmp_path / "marking.py"
    model.write_text(MARKING_MODEL)
    mark = tmp_path / "mark"
    r = advisor_cli(
        "advise", str(model), "--device", "cpu", "--space", fast_space, "--storage", "memory",
        "--in-process", "--quiet", "--out", str(out),
        env={"ADVISOR_TEST_MARK": str(mark)},
    )  # fmt: skip
    return r, mark


# each a CLI process (2-2.5 s): layers.csv in the slow run
@pytest.mark.parametrize(
    "blocked", ["trials.csv", pytest.param("layers.csv", marks=pytest.mark.slow)]
)
def test_unwritable_csv_is_found_before_the_search_and_named(
    tmp_path: Path, fast_space: str, blocked: str
) -> None:
    out = tmp_path / "tuned.json"
    (tmp_path / f"tuned.{blocked}").mkdir()  # no file can be renamed onto a directory
    r, mark = _advise(tmp_path, out, fast_space)
    one_line_error(r, f"tuned.{blocked}", "directory")
    assert not out.exists()  # the config and its trials never disagree
    assert not mark.exists()  # found before the search: the model was never loaded


def test_out_under_a_file_is_found_before_the_search(tmp_path: Path, fast_space: str) -> None:
    blocker = tmp_path / "results"
    blocker.write_text("a file, not a folder")
    out = blocker / "tuned.json"
    r, mark = _advise(tmp_path, out, fast_space)
    one_line_error(r, str(out), "not a directory")
    assert not mark.exists()
    assert blocker.read_text() == "a file, not a folder"


@pytest.mark.slow  # a whole run into a new folder (6 s); the others stop before the search
def test_out_in_a_folder_to_be_made(tmp_path: Path, fast_space: str) -> None:
    out = tmp_path / "new" / "deeper" / "tuned.json"
    r, mark = _advise(tmp_path, out, fast_space)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.is_file() and (out.parent / "tuned.trials.csv").is_file() and mark.exists()
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary file left behind
