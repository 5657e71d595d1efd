"""Writing a report: the HTML file and its PNGs beside it.

Everything is loaded and drawn in memory first and the files are written last, all or none
(`advisor.config.atomic_write_all`), so a failure never leaves a half-written report.
"""

from __future__ import annotations

from pathlib import Path

from advisor.config import atomic_write_all
from advisor.errors import AdvisorError
from advisor.report.load import load_report_data
from advisor.report.page import render_html
from advisor.report.plots import make_plots


def png_dir(out: Path) -> Path:
    """report.html -> report_files/ (the browser convention for a page's companions)."""
    return out.with_name(out.stem + "_files")


def write_report(source: str, out: str | Path, storage: str | None = None) -> Path:
    """Build the report for `source` and write `out` (HTML) and its PNGs; returns `out`."""
    out = Path(out)
    if out.is_dir():
        raise AdvisorError(f"--out {out} is a directory")
    data = load_report_data(source, storage)
    plots = make_plots(data)
    folder = png_dir(out)
    names = {k: f"{folder.name}/{k}.png" for k in plots.png}
    page = render_html(data, plots, names)
    pngs: dict[Path, str | bytes] = {folder / f"{k}.png": v for k, v in plots.png.items()}
    atomic_write_all({**pngs, out: page})  # all or none; the page, which refers to the PNGs, last
    return out

