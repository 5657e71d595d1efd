"""The GPU command (benchmarks/gpu.py), proved as far as a CPU allows: without CUDA it says so in
one line; its plan fits 530 s; a record's targets are judged from its rows; and a CPU run of the
real thing on a tiny model (advise in a subprocess, the re-time a process per setting) writes its
rows and the machine's page where the device tool brings files back."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import gpu, plan
from benchmarks.registry import ROOT
from tests.conftest import DATA, run_env

# The advise run's space: two memory formats, short timing, no precision check to train
SPACE = """schema_version: 1
name: gpu_command_test_cpu
description: the GPU command's CPU test
device: cpu
knobs:
  memory_format: [contiguous, channels_last]
  conv_impl: [native]
budget: {trials: 2, time_s: 30}
timing: {warmup_runs: 1, warmup_s: 0.0, min_samples: 5, max_samples: 20, target_rel_ci: 0.05,
         max_time_s: 0.1}
per_layer: false
race: false
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command runs for minutes")
@pytest.mark.parametrize("flags", [[], ["--check"]])
def test_without_a_gpu_it_says_so_in_one_line(flags: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "benchmarks", "gpu", *flags], cwd=ROOT,
                       env=run_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "no CUDA device" in r.stderr


def test_the_plan_fits_its_deadline_and_keeps_each_models_retime_after_its_runs() -> None:
    parts = gpu.gpu_plan(None, None, True, None)
    assert sum(p.share_s for p in parts) <= gpu.DEADLINE_S
    for i, p in enumerate(parts):
        if p.kind == "worth":  # no advise run of the model after its re-time
            assert all(q.model != p.model for q in parts[i + 1:] if q.kind == "advise")
    quick = gpu.gpu_plan(["small_cnn"], ["quick"], False, None)
    # its share leaves room over its target: a run slower than the target still answers
    assert [(p.kind, p.effort, p.target_s) for p in quick] == [("advise", "quick", 20)]
    assert quick[0].share_s > 20
    first = plan.limit_for(gpu.DEADLINE_S, parts[0].share_s, sum(p.share_s for p in parts[1:]))
    assert first >= parts[0].share_s  # the deadline's slack goes to the part running


def _row(effort: str, **kw: Any) -> dict[str, Any]:
    return {"effort": effort, "status": "ok", "notes": [], "stopped_s": None, **kw}


def test_a_rows_targets_are_judged_from_what_it_measured() -> None:
    worth = {"pick_role": "pick quick",
             "roles": {"default": {"process": "default"}, "pick quick": {"process": "pick_quick"},
                       "hand": {"process": "hand"}},
             "pick_vs": {"pick quick": {"default": [1.11, 1.05, 1.18],
                                        "hand": [0.95, 0.90, 0.99]}}}  # fmt: skip
    got = {t["target"]: t for t in gpu.targets(_row("quick", target_s=45, wall_s=50.0,
                                                        harness_share_gate_apart=0.33,
                                                        worth=worth))}  # fmt: skip
    assert got["wall <= 45 s"] == {"target": "wall <= 45 s", "value": "50.0 s", "met": False}
    assert got["harness <= 60% (gate apart)"]["value"] == "33%"
    assert got["harness <= 60% (gate apart)"]["met"] is True
    assert got["pick as fast as PyTorch's default (re-time)"]["met"] is True
    hand = got["pick as fast as the hand setting (re-time)"]  # the hand setting is faster
    assert hand["met"] is False and hand["value"] == "0.95x [0.90, 0.99]"
    stopped = gpu.targets(_row("default", target_s=180, wall_s=171.0, stopped_s=164.0))
    ends = next(t for t in stopped if t["target"] == "ends on its own")
    assert ends["met"] is False and "stopped at 164 s" in ends["value"]
    budget = gpu.targets(_row("default", wall_s=80.0, notes=["the 90 s budget ran out before 2 "
                                                             "candidate(s) were measured"]))  # fmt: skip
    assert next(t for t in budget if t["target"] == "ends on its own")["met"] is False
    shared = {"pick_role": "pick default", "roles": {"default": {"process": "default"},
                                                     "pick default": {"process": "default"}}}  # fmt: skip
    same = gpu.targets(_row("default", wall_s=1.0, worth=shared))
    assert [t["value"] for t in same][-2] == "the same setting as PyTorch's default"
    assert gpu.targets(_row("quick"))[-1]["met"] is None  # not re-timed: not measured


def test_a_cpu_run_writes_its_rows_and_page_where_the_device_tool_reads(tmp_path: Path) -> None:
    """The GPU command's path on a CPU (docs/gpu-benchmarks.md's smoke run): a real advise and
    its re-times, rows and page into an --out-dir."""
    from benchmarks.__main__ import run

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "out"
    argv = ["gpu", "--device", "cpu", "--model-file", str(DATA / "tiny_cnn.py"), "--efforts",
            "quick", "--space", str(space), "--in-process", "--roles", "default", "pick", "hand",
            "--round-s", "0.1", "--deadline-s", "120", "--out-dir", str(out), "--keep-work",
            "--commit", "abc1234"]  # fmt: skip
    assert run(argv) == 0
    (row,) = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert row["status"] == "ok" and row["commit"] == "abc1234" and row["dirty"] is None
    assert row["wall_s"] > row["stage_s"]["total"] > 0  # end to end: Python's start-up too
    assert 0 <= row["harness_share_gate_apart"] <= row["harness_share"] <= 1
    w = row["worth"]
    assert w["rounds"] >= 5 and set(w["roles"]) == {"default", "pick quick", "hand"}
    assert w["roles"]["hand"]["label"].startswith("memory_format=channels_last")
    for role in w["roles"].values():
        assert role["first_call_s"] > 0 and role["median_ms"] > 0, role
    assert {t["target"] for t in row["targets"]} >= {"harness <= 60% (gate apart)"}
    page = (out / f"{row['machine']}.md").read_text()
    assert "## What the advice is worth" in page and "| tiny_cnn | train | quick |" in page
    with tarfile.open(out / "gpu_work.tgz") as tar:  # --keep-work: the configs and trials
        names = tar.getnames()
    assert any(n.endswith(".trials.csv") for n in names)
