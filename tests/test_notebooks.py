"""The walkthrough notebooks are committed executed (a reader sees their tables and plots on a
code host), and CI re-executes them and compares: sources, kinds of output, table columns and
no errors, not the numbers (timings differ run to run). On CPU in CI: small sizes, a quick space."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_notebooks", NOTEBOOKS / "build_notebooks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builder = _builder()
NAMES = list(builder.NOTEBOOKS)


def _committed(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_what_build_notebooks_writes(name: str, tmp_path: Path) -> None:
    pytest.importorskip("ruff")
    cells = [(c.cell_type, c.source) for c in _committed(name).cells]
    assert cells == [(c.cell_type, c.source) for c in builder.built(name, tmp_path).cells], (
        "edit notebooks/build_notebooks.py, then run it"
    )


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_shows_every_cell_run_and_its_tables_or_plots(name: str) -> None:
    code = [c for c in _committed(name).cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))  # top to bottom
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o.get("data", {}) for o in outputs]
    assert any("image/png" in d or "<table" in d.get("text/html", "") for d in shown)


@pytest.mark.slow  # each notebook tunes as it runs (4-10 s); the default run checks their sources
@pytest.mark.parametrize("name", NAMES)
def test_notebook_reruns_as_committed(name: str) -> None:
    committed = _committed(name)
    rerun = builder.execute(copy.deepcopy(committed))  # raises, naming the cell, on an error
    assert builder.signature(rerun) == builder.signature(committed)
    stdout = [o for c in rerun.cells for o in c.get("outputs", []) if o.get("name") == "stdout"]
    assert "device:" in "".join(o.text for o in stdout)
