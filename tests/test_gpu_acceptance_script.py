"""benchmarks/gpu_acceptance.py (issue 55's acceptance on a GPU), proved as far as a CPU allows.

A CPU run of the real thing on a tiny model: `advisor advise` in a subprocess, its table, and the
re-time with a process per setting (real processes, real timing), interleaved, first calls
apart. It checks shape and consistency, not speed. Without CUDA the script says so and exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

from tests.conftest import DATA, load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"
# The advise run's space: two memory formats, short timing, no precision check to train
SPACE = """schema_version: 1
name: acceptance_test_cpu
description: gpu_acceptance.py's CPU test
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


def _script():  # type: ignore[no-untyped-def]
    return load_script(SCRIPT, "gpu_acceptance_under_test")  # benchmarks/ goes on sys.path


def test_without_a_gpu_it_says_so_in_one_line() -> None:
    if torch.cuda.is_available():
        return  # on a GPU machine the script runs for minutes: the acceptance, not a unit test
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no CUDA device" in r.stderr
    assert r.stdout == ""


def test_a_cpu_run_tables_the_advice_and_retimes_each_setting_in_its_own_process(
    tmp_path: Path,
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "out"
    mod = _script()
    argv = ["--device", "cpu", "--model-file", str(DATA / "tiny_cnn.py"), "--efforts", "quick",
            "--space", str(space), "--in-process", "--variants", "default", "pick", "hand",
            "--round-s", "0.1", "--deadline-s", "100", "--out-dir", str(out), "--keep-work"]  # fmt: skip
    assert mod.main(argv) == 0
    data = json.loads((out / "gpu_acceptance_cpu.json").read_text())
    text = (out / "gpu_acceptance_cpu.md").read_text()

    (run,) = data["runs"]
    assert run["effort"] == "quick" and run["exit_code"] == 0 and "stopped_s" not in run
    assert run["wall_s"] > run["stage_s"]["total"] > 0  # end to end: Python's start-up too
    from gpu_acceptance_report import shares  # type: ignore[import-not-found]

    share, apart = shares(run)  # from the advisor's own breakdown
    assert 0 <= apart <= share <= 1

    rt = data["retimes"]["tiny_cnn"]
    roles, res = rt["roles"], rt["result"]
    assert set(roles) == {"default", "pick quick", "hand"}
    assert roles["hand"] == "hand" and roles["default"] == "default"
    if run["pick"] == "default":  # the same settings share one process
        assert roles["pick quick"] == "default"
    procs = set(roles.values())
    assert set(rt["variants"]) == procs
    assert res["rounds"] >= 5
    pids = {res[p]["pid"] for p in procs}
    assert len(pids) == len(procs) and os.getpid() not in pids  # a process of its own each
    for p in procs:
        e = res[p]
        assert "error" not in e, e
        assert e["first_call_s"] > 0 and e["ready_s"] > 0  # the first call, timed apart ...
        assert len(e["samples_ms"]) == res["rounds"]  # ... from one sample a round
        assert all(ms > 0 for ms in e["samples_ms"]) and e["median_ms"] > 0
    assert res["hand"]["label"] == "memory_format=channels_last, amp=bf16, cudnn_benchmark=on"

    checks = {c["target"]: c for c in data["targets"]["checks"]}
    assert checks["harness <= 60% (gate apart)"]["value"] == f"{apart:.0%}"
    for what in ("PyTorch's default", "the hand setting"):
        assert checks[f"pick as fast as {what} (re-time)"]["met"] in (True, False)
    assert "## tiny_cnn, --effort quick" in text and "| hand setting |" in text
    assert f"{res['rounds']} interleaved rounds" in text
    assert [p["status"] for p in data["parts"]] == ["ok", "ok"]
    with tarfile.open(out / "gpu_acceptance_cpu_work.tgz") as tar:  # --keep-work: the trials
        names = tar.getnames()
    assert "tiny_cnn.quick.json" in names and "tiny_cnn.quick.trials.csv" in names


def test_a_deadline_that_falls_during_start_up_stops_every_process(tmp_path: Path) -> None:
    _script()
    from process_retime import retime_in_processes  # type: ignore[import-not-found]

    t0 = time.perf_counter()
    got = retime_in_processes(DATA / "tiny_cnn.py", {"default": {}, "compile": {"compile": "default"}},
                              "train", "cpu", deadline=t0 + 2.5, round_s=0.1, log=lambda _: None)  # fmt: skip
    assert time.perf_counter() - t0 < 15  # no hang: the processes are killed, not waited for
    assert got["rounds"] == 0
    for name in ("default", "compile"):
        assert "deadline" in got[name]["error"] or "no time left" in got[name]["error"]


def test_the_deadline_is_shared_in_proportion_and_early_parts_leave_theirs_to_later_ones() -> None:
    mod = _script()
    later = sum(p.share_s for p in mod.PLAN[1:])
    assert sum(p.share_s for p in mod.PLAN) <= 530  # the plan fits the default deadline
    first = mod.limit_for(530, mod.PLAN[0].share_s, later)
    assert first == 530 - later >= mod.PLAN[0].share_s  # the slack goes to the part running
    behind = mod.limit_for(200, 20, 380)  # behind the plan: each part its proportion
    assert abs(behind - 200 * 20 / 400) < 1e-9
    assert mod.limit_for(0, 20, 100) == 0


def _retime(default_ms: float, pick_ms: float, hand_ms: float) -> dict:  # type: ignore[type-arg]
    def row(label: str, ms: float, first: float) -> dict:  # type: ignore[type-arg]
        samples = [ms * (1 + 0.001 * (i % 3)) for i in range(10)]
        return {"label": label, "ready_s": 5.0, "first_call_s": first, "warm_ms": ms,
                "samples_ms": samples, "median_ms": ms, "iqr_ms": 0.01, "ci_low_ms": ms * 0.99,
                "ci_high_ms": ms * 1.01}  # fmt: skip

    return {"limit_s": 60, "seconds": 40, "variants": {},
            "roles": {"default": "default", "pick quick": "pick_quick", "hand": "hand",
                      "compile": "compile"},
            "result": {"rounds": 10, "default": row("default", default_ms, 0.4),
                       "pick_quick": row("memory_format=channels_last, tf32=on", pick_ms, 0.5),
                       "hand": row("memory_format=channels_last, amp=bf16, cudnn_benchmark=on",
                                   hand_ms, 12.6),
                       "compile": row("torch.compile(mode='default')", 18.0, 61.0)}}  # fmt: skip


def test_a_gpu_record_is_judged_against_the_issues_targets() -> None:
    """The report's logic on a hand-written H200 record: no GPU figure is measured here."""
    mod = load_script(ROOT / "benchmarks" / "gpu_acceptance_report.py", "acceptance_report_test")
    env = {"device_type": "cuda", "device_name": "NVIDIA H200", "capability": "9.0",
           "device_memory_gb": 139.8, "driver": "580", "cuda": "13.0", "cudnn": "91900",
           "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3"}  # fmt: skip
    stage_s = {"total": 40.0, "timed samples": 20.0, "global knobs": 30.0,
               "global knobs: precision checks": 10.0}  # fmt: skip
    quick = {"model": "tv_resnet50", "effort": "quick", "target_s": 45, "wall_s": 50.0,
             "stage_s": stage_s, "pick": "memory_format=channels_last, tf32=on",
             "precisions": ["bf16: trains like fp32 on this model"], "command": "advisor advise"}  # fmt: skip
    default = {"model": "tv_resnet50", "effort": "default", "target_s": 180, "wall_s": 170.0,
               "stage_s": stage_s, "pick": "x", "command": "advisor advise",
               "notes": ["the 600 s budget ran out before 2 candidate(s) were measured: a, b"]}  # fmt: skip
    late = {"model": "tv_r2plus1d_18", "effort": "quick", "target_s": 45,
            "error": "not run: the deadline"}  # fmt: skip
    rt = _retime(default_ms=22.2, pick_ms=20.0, hand_ms=24.4)
    rt["result"]["compile"] = {"label": "torch.compile(mode='default')",
                               "error": "its first call ran past the deadline (stopped after 58 s)"}  # fmt: skip
    data = {"environment": env, "date": "d", "commit": "c", "command": "python x",
            "deadline_s": 530, "round_s": 1.0, "seconds": 400, "parts": [],
            "runs": [quick, default, late], "retimes": {"tv_resnet50": rt}}  # fmt: skip
    verdicts = mod.evaluate(data)
    got = {(c["run"], c["target"]): c for c in verdicts["checks"]}
    assert got[("tv_resnet50 quick", "wall <= 45 s")]["met"] is False
    harness = got[("tv_resnet50 quick", "harness <= 60% (gate apart)")]
    assert harness["value"] == "33%" and harness["met"] is True  # (40-10-20)/(40-10)
    assert got[("tv_resnet50 default", "ends on its own")]["met"] is False
    assert got[("tv_resnet50 quick", "pick as fast as PyTorch's default (re-time)")]["met"] is True
    assert got[("tv_resnet50 quick", "pick as fast as the hand setting (re-time)")]["met"] is True
    assert (
        got[("tv_resnet50 default", "pick as fast as PyTorch's default (re-time)")]["met"] is None
    )
    (note,) = verdicts["notes"]
    assert "hand setting is slower than PyTorch's default (24.4 against 22.2 ms" in note
    text = mod.render(data)
    assert "| NVIDIA H200 | 9.0 | 139.8 | 580 | 13.0 | 91900 | 2.11.0 | 3.6.0 |" in text
    assert "12.60 (cuDNN's search)" in text
    assert "its first call ran past the deadline (stopped after 58 s)" in text
    assert (
        "Targets: wall <= 45 s: 50.0 s, **missed**; harness <= 60% (gate apart): 33%, met" in text
    )
    assert got[("tv_r2plus1d_18 quick", "wall <= 45 s")] == {
        "run": "tv_r2plus1d_18 quick", "target": "wall <= 45 s", "value": "not run", "met": None}  # fmt: skip
    assert "Not measured: not run: the deadline." in text
    assert "bf16 on ResNet-50" in text and "bf16: trains like fp32 on this model" in text
