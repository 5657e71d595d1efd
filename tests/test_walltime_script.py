"""benchmarks/advise_walltime.py: the labels of picks and the comparison table."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "advise_walltime.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "walltime_under_test")


def test_pick_labels_name_settings_and_counted_layers() -> None:
    label = _script()._label
    assert label({"memory_format": None, "amp": None, "layers": {}}) == "default"
    written = {"memory_format": "contiguous", "tf32": "conv", "amp": "off", "conv_impl": "native"}
    assert label({**written, "cudnn_benchmark": False, "layers": {}}) == "default"
    assert label({**written, "amp": "bf16"}) == "amp=bf16"
    settings = {
        "memory_format": "channels_last",
        "layers": {"a": "unfold_gemm", "b": "unfold_gemm"},
    }
    assert label(settings) == "memory_format=channels_last, layers: 2x unfold_gemm"


def test_table_has_medians_picks_errors_and_the_ratio() -> None:
    script = _script()
    args = argparse.Namespace(device="cpu", mode="train", repeats=2)
    rows = {
        "net": {
            "aaa": [{"wall_s": 100.0, "pick": "default"}, {"wall_s": 120.0, "pick": "default"}],
            "bbb": [{"wall_s": 40.0, "pick": "default"}, {"wall_s": 60.0, "pick": "amp=bf16"}],
        },
        "broken": {"aaa": [{"wall_s": 1.0, "error": "advisor: error: boom"}], "bbb": []},
    }
    table = [ln for ln in script._report(args, ["aaa", "bbb"], rows).splitlines() if "| net" in ln]
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells == ["net", "110.0", "`default`", "50.0", "`amp=bf16` / `default`", "2.20x"]
    text = script._report(args, ["aaa", "bbb"], rows)
    assert "| broken | - | advisor: error: boom | - | not run | - |" in text


def test_labels_written_with_every_setting_are_shortened() -> None:
    shorten = _script()._shorten
    full = "memory_format=contiguous, tf32=conv, amp=off, cudnn_benchmark=False, conv_impl=native"
    assert shorten(full) == "default"
    assert shorten(full.replace("amp=off", "amp=bf16") + ", layers: 2x unfold_gemm") == (
        "amp=bf16, layers: 2x unfold_gemm"
    )


def test_the_breakdown_table_says_where_the_time_went() -> None:
    script = _script()
    args = argparse.Namespace(device="cpu", mode="train", repeats=1)
    stage_s = {"start-up and load": 3.0, "global knobs": 12.0, "global knobs: precision checks": 4.0,
               "final check": 2.0, "other": 0.5, "total": 17.5}  # fmt: skip
    rows = {"net": {"aaa": [{"wall_s": 20.0, "pick": "default", "stage_s": stage_s}]},
            "old": {"aaa": [{"wall_s": 30.0, "pick": "default"}]}}  # fmt: skip
    text = script._report(args, ["aaa"], rows, machine="m", command="c")
    assert "Sum of the medians: aaa 50.0 s" in text
    header = next(ln for ln in text.splitlines() if ln.startswith("| model | start-up"))
    assert "global knobs: precision checks" in header
    row = next(ln for ln in text.splitlines() if ln.startswith("| net | 3.0"))
    assert row.split("|")[3].strip() == "12.0"
    after = text.split("Where the time went", 1)[1]
    assert "| old |" not in after  # a revision that did not record it has no breakdown row


def test_the_breakdown_shows_the_harness_share_and_the_time_less_cold_compiles() -> None:
    script = _script()
    args = argparse.Namespace(device="cpu", mode="train", repeats=1, effort="quick")
    stage_s = {"start-up and load": 3.0, "global knobs": 8.0,
               "global knobs: precision checks": 1.5, "global knobs: output and layer checks": 1.0,
               "global knobs: timed samples": 4.0,
               "compile": 12.0, "compile: cold compiles": 10.0, "compile: gate's compiles": 2.0,
               "other": 0.0, "total": 20.0, "timed samples": 5.0}  # fmt: skip
    rows = {"net": {"aaa": [{"wall_s": 21.0, "pick": "default", "stage_s": stage_s}]}}
    text = script._report(args, ["aaa"], rows, machine="m", command="c")
    assert "`--effort quick`" in text
    header = next(ln for ln in text.splitlines() if ln.startswith("| model | start-up"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    row = next(ln for ln in text.splitlines() if ln.startswith("| net | 3.0"))
    cells = dict(zip(cols, (c.strip() for c in row.strip("|").split("|"))))
    assert cells["total less cold compiles"] == "10.0" and cells["harness %"] == "75.0"
    # the gate's 4.5 s apart: 5 s timed of 15.5 s
    assert cells["harness % less the gate"] == f"{100 * (1 - 5 / 15.5):.1f}"
    # the global knobs alone: 4 s of samples in 8 s; in 5.5 s with its gate's 2.5 s apart
    assert cells["global knobs harness %"] == "50.0"
    assert cells["global knobs harness % less the gate"] == f"{100 * (1 - 4 / 5.5):.1f}"
