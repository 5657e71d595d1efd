"""benchmarks/zoo.py: a quick CPU run on a tiny model end to end, the report's columns, skipped
models and failed rows."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "zoo.py"
TINY = ROOT / "tests" / "data" / "tiny_cnn.py"


def _zoo() -> ModuleType:
    return load_script(SCRIPT, "zoo_under_test")  # puts benchmarks/ on sys.path for fresh_retime


def _table(text: str) -> list[list[str]]:
    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows]


@pytest.mark.slow
def test_quick_cpu_run_on_a_tiny_model(tmp_path: Path) -> None:
    zoo = _zoo()
    out = tmp_path / "zoo.md"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--model-file", str(TINY), "--modes", "infer"]
    cmd += ["--variants", "plain", "everything_on", "--out", str(out)]  # no compile: slow on CPU
    # A verdict on completion, so a generous limit (on a busy machine every step is slower)
    started = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    took_s = time.perf_counter() - started
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert "Machine: CPU " in text and "torch threads" in text and "torch 2." in text
    assert "Command: `python benchmarks/zoo.py --quick --model-file" in text
    header, _sep, row = _table(text)
    assert header == zoo.COLUMNS
    assert len(row) == len(header) and row[:2] == ["tiny_cnn", "infer"]
    assert float(row[2]) > 1.0  # the advise wall time: a subprocess, Python start-up included
    assert row[3].startswith("`")  # the pick
    for cell in (row[6], row[7], row[9]):  # pick vs plain / default, everything on vs default
        assert cell.endswith("]") and "x [" in cell
    assert row[10] == "-" and row[11] == "-" and row[13] == "-"  # the rival compile not run

    data = json.loads(out.with_suffix(".json").read_text())
    assert data["environment"]["device_type"] == "cpu"
    (rec,) = data["rows"]
    adv = rec["advise"]
    assert (
        adv["command"].startswith("python -m advisor advise ")
        and "--storage memory" in adv["command"]
    )
    # the advise subprocess's wall time: a part of the whole script's, however busy the machine
    assert 1.0 < adv["wall_s"] < took_s and adv["label"] and adv["trials"] >= 1
    # the advisor's own torch.compile candidate: measured, or left out by the budget with a note
    assert adv["compile_note"] or any("compile=default" in n for n in adv["notes"]), adv
    t = rec["retime"]
    assert set(t) == {"default", "pick", "everything_on", "plain"}
    for name, v in t.items():
        assert 0 < v["median_ms"] < 1e4 and len(v["samples_ms"]) >= 10, name
        assert v["ci_low_ms"] <= v["median_ms"] <= v["ci_high_ms"], name
    assert t["default"]["err"] == 0.0  # PyTorch's default through advisor.apply: the reference
    assert t["pick"]["err"] < 1e-2 and t["everything_on"]["err"] < 5e-2  # bf16 at most
    ratios = zoo.ratios(rec)
    assert ratios.pop("compile_vs_default") is None and ratios.pop("pick_vs_compile") is None
    for name, ratio in ratios.items():
        mid, lo, hi = ratio
        assert 0 < lo <= mid <= hi and math.isfinite(hi), name


def test_models_without_their_package_are_skipped_with_the_reason(tmp_path: Path) -> None:
    zoo = _zoo()
    by_name = {m.name: m for m in zoo.MODELS}
    assert {"tv_resnet50", "tv_mobilenet_v3_large", "timm_convnext_tiny"} <= set(by_name)
    cpu = zoo.select_models(zoo.parse_args(["--device", "cpu"]))
    assert {m.name for m in cpu} == {
        "resnet18", "mobilenet_v3_small", "monai_unet3d", "relu_bn_block", "small_cnn",
        "video_cnn",
    }  # fmt: skip
    assert len(zoo.select_models(zoo.parse_args(["--device", "cuda"]))) == len(zoo.MODELS)
    if importlib.util.find_spec("torchvision") is None:
        why = zoo.missing(by_name["tv_resnet50"])
        assert why is not None and "needs torchvision" in why and "pip install" in why
    if importlib.util.find_spec("timm") is None:
        why = zoo.missing(by_name["timm_convnext_tiny"])
        assert why is not None and "needs timm" in why
    assert zoo.missing(by_name["relu_bn_block"]) is None
    with pytest.raises(SystemExit, match="no model matches"):
        zoo.select_models(zoo.parse_args(["--models", "nope"]))


def test_the_report_shows_skipped_and_failed_rows() -> None:
    zoo = _zoo()
    samples = [1.0, 1.1, 0.9] * 5
    fast = [x / 2 for x in samples]
    data = {
        "command": "python benchmarks/zoo.py --device cpu",
        "environment": {
            "device_type": "cpu",
            "cpu_model": "Test CPU",
            "torch_threads": 2,
            "logical_cpus": 2,
            "torch": "2.x",
            "fingerprint": "f",
        },  # fmt: skip
        "options": {"rounds": 6, "min_run_time": 0.5, "quick": False, "space": None},
        "rows": [
            {"model": "tv", "mode": "train", "skipped": "torchvision is not installed"},
            {"model": "a", "mode": "infer", "advise": {"wall_s": 3.0, "error": "boom"}},
            {
                "model": "b",
                "mode": "train",
                "other_cpu_share": 0.4,
                "advise": {
                    "wall_s": 12.0,
                    "label": "amp=bf16",
                    "settings": {"amp": "bf16"},
                    "claimed_speedup": 1.9,
                    "claimed_speedup_ci": [1.7, 2.1],
                },  # fmt: skip
                "retime": {
                    "default": {"median_ms": 1.0, "samples_ms": samples, "err": 0.0},
                    "pick": {"median_ms": 0.5, "samples_ms": fast, "err": 3e-3, "grad_err": 2e-2},
                    "compile": {"label": "torch.compile", "error": "InductorError: no compiler"},
                },
            },
        ],
    }
    text = zoo.render(data)
    header, _sep, *rows = _table(text)
    assert all(len(r) == len(header) for r in rows)
    skipped, failed, ok = rows
    assert skipped[3] == "skipped: torchvision is not installed"
    assert failed[2] == "3.0" and failed[3] == "advise failed: boom"
    assert ok[7].startswith("2.00x [") and ok[8] == "1.90x [1.70-2.10]"
    assert ok[11] == "failed" and ok[12] == "3.0e-03 / 2.0e-02"
    assert "- b train: compile failed: InductorError: no compiler" in text
    assert "- b train: other processes used 40% of the machine's CPU time" in text
    data["rows"][2]["other_cpu_share"] = 0.02  # the benchmark's own threads are not "busy"
    assert "other processes" not in zoo.render(data)


def test_a_merge_replaces_skipped_and_failed_rows_with_measured_ones() -> None:
    zoo = _zoo()
    measured = {"model": "unet", "mode": "train", "advise": {"wall_s": 5.0, "label": "default"}}
    rows = [
        {"model": "unet", "mode": "train", "skipped": "needs MONAI"},
        {"model": "a", "mode": "infer", "advise": {"wall_s": 3.0, "error": "boom"}},
        {"model": "b", "mode": "infer", "advise": {"wall_s": 2.0, "label": "default"}},
        measured,
        {"model": "a", "mode": "infer", "advise": {"wall_s": 4.0, "label": "amp=bf16"}},
        {"model": "b", "mode": "infer", "skipped": "not measured again"},
    ]
    merged = zoo.merged_rows(rows)
    # one row per model and mode, in the order first seen
    assert [(r["model"], r["mode"]) for r in merged] == [
        ("unet", "train"),
        ("a", "infer"),
        ("b", "infer"),
    ]
    assert merged[0] is measured  # the later measurement replaced the skipped row
    assert merged[1]["advise"]["label"] == "amp=bf16"  # and the failed one
    assert merged[2]["advise"]["wall_s"] == 2.0  # a measured row is not replaced by a skipped one


def test_a_pick_slower_than_compile_says_when_the_compile_pays_back() -> None:
    zoo = _zoo()
    samples = [10.0, 10.2, 9.8] * 5
    row = {
        "model": "m",
        "mode": "train",
        "advise": {"compile_note": "torch.compile is not recommended: it cannot pay back"},
        "retime": {
            "pick": {"median_ms": 10.0, "samples_ms": samples},
            "compile": {"median_ms": 8.0, "samples_ms": [x * 0.8 for x in samples],
                        "compile_s": 40.0},  # fmt: skip
        },
    }
    note = zoo._compile_break_even(row, zoo.ratios(row)["pick_vs_compile"])
    assert note is not None
    assert "(8 against 10 ms a step)" in note and "(40.0 s) pays that back after 20,000 steps" in note
    assert note.endswith("The advisor: torch.compile is not recommended: it cannot pay back")
    row["retime"]["compile"]["samples_ms"] = samples  # as fast, within noise: nothing to say
    row["retime"]["compile"]["median_ms"] = 10.0
    assert zoo._compile_break_even(row, zoo.ratios(row)["pick_vs_compile"]) is None
