"""The GPU command: one call under 9 minutes on an H100/H200, rows to the same table.

`python -m benchmarks gpu` runs, as a new user would, `advisor advise MODEL --mode train
--device cuda --effort E --storage memory` (each in its own process, timed end to end) on the
`gpu` set, then re-times each model's picks against PyTorch's default, the hand setting
(channels_last + bf16 autocast + cudnn.benchmark) and `torch.compile` in fresh processes
(benchmarks/retime.py). The deadline (530 s by default) is shared by the parts in proportion to
PLAN's seconds. Each row carries the targets it answers (`targets`: wall time within the part's
target, harness at most 60% with the numeric gate's checks counted apart at quick effort, a
default-effort run ending on its own, the pick at least as fast as the default and the hand
setting within noise).

`--check` instead proves the GPU path on a newly lent GPU, each step in its own process under
one deadline (520 s): the CLI's default path (`advisor advise` at default effort, a row), the
GPU tests (`pytest -m gpu tests/gpu`), `advisor.apply` then the legacy TF32 getters and
`torch.compile(mode="max-autotune")`, and one seed case re-timed (a row). It writes
`gpu_check.md` with each step's result and output tail; exit code 0 when every step passed.

On the device machine the tree is a copy without git: pass `--commit`, and `--out-dir $OUT`,
where the rows (`runs.jsonl`) and the machine's page go; here, `python -m benchmarks merge
OUT/runs.jsonl` appends them to the committed table. Without a CUDA device it says so in one
line and exits 2 (`--device cpu` is a smoke run of the same path).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import plan as plan_mod
from benchmarks.registry import BY_NAME, ROOT, Model, UsageError
from benchmarks.table import TABLE

HARNESS_TARGET = 0.60
DEADLINE_S = 530.0
CHECK_DEADLINE_S = 520.0
# Quick runs first (the cheapest answers), each model's re-time once its last advise run is
# done: (kind, model, effort, share of the deadline in seconds, wall-time target). The targets are
# issue 55's. The shares are what each part took on an H200 at 993ef73 with room to spare (quick
# small_cnn 34 s, ResNet-50 37.5 s, R(2+1)D-18 54.4 s; default small_cnn 54.9 s; the re-times
# 35-59 s; default ResNet-50 ran past 227 s, 120 s of it Triton's autotuning, now bounded), so
# that a run slower than its target still brings its answer back; summed to 530 s.
PLAN: tuple[tuple[str, str, str | None, float, float | None], ...] = (
    ("advise", "small_cnn", "quick", 40, 20),
    ("advise", "tv_resnet50", "quick", 45, 45),
    ("advise", "tv_r2plus1d_18", "quick", 60, 45),
    ("worth", "tv_r2plus1d_18", None, 40, None),
    ("advise", "small_cnn", "default", 65, 90),
    ("worth", "small_cnn", None, 35, None),
    ("advise", "tv_resnet50", "default", 190, 180),
    ("worth", "tv_resnet50", None, 55, None),
)


def gpu_plan(only: list[str] | None, efforts: list[str] | None, retime: bool,
             model_file: Path | None) -> list[plan_mod.Part]:  # fmt: skip
    """The parts of PLAN for the models and efforts asked for; with `model_file`, that file
    at `efforts` (quick by default) and its re-time, in even shares."""
    if model_file is not None:
        m = Model(model_file.stem, str(model_file.resolve()), f"the model file {model_file}")
        chosen = efforts or ["quick"]
        parts = [plan_mod.Part("advise", m, "train", e, 1.0) for e in chosen]
        return parts + ([plan_mod.Part("worth", m, "train", None, 1.0)] if retime else [])
    parts = []
    for kind, name, effort, share, target in PLAN:
        if only and name not in only:
            continue
        if kind == "advise" and efforts and effort not in efforts:
            continue
        if kind == "worth" and not retime:
            continue
        parts.append(plan_mod.Part(kind, BY_NAME[name], "train", effort, share,
                                   target_s=target))  # fmt: skip
    return parts


# ======================================================================== the targets


def _budget_end(row: dict[str, Any]) -> str | None:
    """Why the run did not end on its own (None: it did)."""
    if row.get("stopped_s") is not None:
        return f"stopped at {row['stopped_s']:.0f} s (its share of the deadline)"
    said = [t for t in row.get("notes") or [] if "budget ran out" in t]
    return said[0] if said else None


def targets(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets a row answers: each met (True), missed (False) or not measured (None)."""
    out: list[dict[str, Any]] = []

    def check(target: str, value: str, met: bool | None) -> None:
        out.append({"target": target, "value": value, "met": met})

    wall, ran = row.get("wall_s"), row.get("status") == "ok" or row.get("stopped_s") is not None
    if row.get("target_s") is not None:
        check(f"wall <= {row['target_s']:g} s", "not run" if wall is None else f"{wall:.1f} s",
              None if wall is None else wall <= row["target_s"] and row.get("stopped_s") is None)
    if row["effort"] == "quick":
        share = row.get("harness_share_gate_apart")
        check(f"harness <= {HARNESS_TARGET:.0%} (gate apart)",
              "-" if share is None else f"{share:.0%}",
              None if share is None else share <= HARNESS_TARGET)  # fmt: skip
    if row["effort"] == "default":
        why = _budget_end(row)
        check("ends on its own", why or ("yes" if ran else "not run"), (why is None) if ran else None)
    worth = row.get("worth") or {}
    versus = (worth.get("pick_vs") or {}).get(worth.get("pick_role"), {})
    same = (worth.get("roles") or {})
    for role, what in (("default", "PyTorch's default"), ("hand", "the hand setting")):
        mine = same.get(worth.get("pick_role"), {}).get("process")
        if mine is not None and mine == same.get(role, {}).get("process"):
            check(f"pick as fast as {what} (re-time)", f"the same setting as {what}", True)
            continue
        s = versus.get(role)  # its time / the pick's: at least 1 within noise is as fast
        check(f"pick as fast as {what} (re-time)",
              "-" if s is None else f"{s[0]:.2f}x [{s[1]:.2f}, {s[2]:.2f}]",
              None if s is None else s[2] >= 1.0)  # fmt: skip
    return out


# ======================================================================== --check


APPLY_COMPILE = r"""
import importlib.util, json, sys, torch
import advisor
spec = importlib.util.spec_from_file_location("small_cnn", "advisor/examples/small_cnn.py")
small_cnn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(small_cnn)
model = small_cnn.build_model()
(x,) = small_cnn.example_inputs()
tuned = advisor.apply(sys.argv[1], model)
legacy = {
    "get_float32_matmul_precision": torch.get_float32_matmul_precision(),
    "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
}
(xd,) = tuned.inputs(x)
tuned.model.eval()
with torch.no_grad(), tuned.autocast():
    eager = tuned.model(xd).float()
    compiled = torch.compile(tuned.model, mode="max-autotune")
    out = compiled(xd).float()
err = ((out - eager).norm() / eager.norm()).item()
print(json.dumps({"settings": tuned.settings.label(), "legacy": legacy, "compiled_vs_eager": err}))
"""


def _step(name: str, cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """One step in its own process: ok (exit code 0) or failed, its seconds, its output."""
    from benchmarks.table import child_env

    print(f"[gpu --check] {name}", flush=True)
    start = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                           env=child_env())  # fmt: skip
        status = "ok" if r.returncode == 0 else f"failed (exit code {r.returncode})"
        out = (r.stdout or "") + (r.stderr or "")
    except subprocess.TimeoutExpired as e:
        status = f"timed out after {timeout_s:.0f} s"
        out = "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
    seconds = time.perf_counter() - start
    print(f"[gpu --check] {name}: {status} in {seconds:.0f} s", flush=True)
    return {"step": name, "status": status, "seconds": round(seconds, 1), "output": out[-4000:]}


def check(opts: plan_mod.Options, out_dir: Path | None) -> int:
    """The --check steps (the module's docstring); the report to out_dir/gpu_check.md."""
    start = time.perf_counter()
    deadline = opts.deadline_s or CHECK_DEADLINE_S
    steps: list[dict[str, Any]] = []

    def left() -> float:
        return deadline - (time.perf_counter() - start)

    def rows_step(name: str, parts: list[plan_mod.Part], own_s: float,
                  extra: tuple[str, ...]) -> None:  # fmt: skip
        if left() < 20:
            steps.append({"step": name, "status": "not run: the deadline", "seconds": 0.0})
            return
        t0 = time.perf_counter()
        o = plan_mod.Options(**{**opts.__dict__, "deadline_s": min(own_s, left()),
                                "extra": (*opts.extra, *extra)})  # fmt: skip
        rows = plan_mod.run_plan(parts, o)
        ok = [r for r in rows if r.get("status") == "ok"]
        worth: list[dict[str, Any]] = [r["worth"] for r in rows if r.get("worth")]
        failed = [w["error"] for w in worth if "error" in w]
        why = failed or [r["status"] for r in rows if r.get("status") != "ok"] or ["no row"]
        status = "ok" if ok and not failed else f"failed: {why[0]}"
        steps.append({"step": name, "status": status, "seconds": round(time.perf_counter() - t0, 1),
                      "output": "\n".join(f"{r['model']} {r['effort']}: {r.get('wall_s')} s, "
                                          f"{r.get('pick')}" for r in rows)})  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        small = BY_NAME["small_cnn"]
        tuned = Path(tmp) / "tuned.json"
        rows_step(f"CLI advise --device {opts.device} (isolated), a row",
                  [plan_mod.Part("advise", small, "train", "default", 1.0)], 150,
                  ("--budget", "60"))  # fmt: skip
        py = sys.executable
        for name, cmd, own in (
            ("GPU tests (pytest -m gpu tests/gpu)",
             [py, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
              "--durations=8"], 300.0),
            ("advisor.apply, legacy TF32 getters, torch.compile(max-autotune)",
             [py, "-m", "advisor", "advise", "advisor/examples/small_cnn.py", "--device",
              opts.device, "--effort", "quick", "--storage", "memory", "--quiet", "--out",
              str(tuned)], 180.0),
        ):  # fmt: skip
            if left() < 20:
                steps.append({"step": name, "status": "not run: the deadline", "seconds": 0.0})
                continue
            steps.append(_step(name, cmd, min(own, left())))
            if name.startswith("advisor.apply") and steps[-1]["status"] == "ok":
                steps[-1] = {**_step(name, [py, "-c", APPLY_COMPILE, str(tuned)],
                                     min(own, left())), "step": name}  # fmt: skip
        seed = BY_NAME["seed_conv2d_3to16"]
        rows_step("seed_conv2d_3to16 advised at quick effort and re-timed, a row",
                  [plan_mod.Part("advise", seed, "infer", "quick", 1.0),
                   plan_mod.Part("worth", seed, "infer", None, 1.0)], 240, ())  # fmt: skip
    text = ["# GPU check", "", f"Command: `{opts.command}`, {time.perf_counter() - start:.0f} s.",
            "", "| step | result | seconds |", "| --- | --- | ---: |"]  # fmt: skip
    text += [f"| {s['step']} | {s['status']} | {s['seconds']:.0f} |" for s in steps]
    for s in steps:
        if s.get("output"):
            text += ["", f"## {s['step']}", "", "```text", s["output"].strip()[-3000:], "```"]
    report = "\n".join(text) + "\n"
    print(report, flush=True)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gpu_check.md").write_text(report)
    return 0 if all(s["status"] == "ok" for s in steps) else 1


# ======================================================================== the command


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run")
    ap.add_argument("--out-dir", type=Path, help="where the rows (runs.jsonl) and the page go "
                    "(the device tool's $OUT); default: the committed table")  # fmt: skip
    ap.add_argument("--deadline-s", type=float, help=f"every part ends by then (default "
                    f"{DEADLINE_S:.0f}; --check {CHECK_DEADLINE_S:.0f})")  # fmt: skip
    ap.add_argument("--commit", help="the commit the tree is at (the device machine has no git)")
    ap.add_argument("--check", action="store_true", help="prove the GPU path instead (see above)")
    ap.add_argument("--only", nargs="+", metavar="MODEL", choices=sorted({p[1] for p in PLAN}),
                    help="the plan's parts for these models alone")  # fmt: skip
    ap.add_argument("--efforts", nargs="+", choices=["quick", "default", "full"],
                    help="the plan's advise runs at these efforts alone")  # fmt: skip
    ap.add_argument("--no-retime", action="store_true", help="no re-time parts")
    ap.add_argument("--model-file", type=Path, help="instead of the plan: this model file")
    ap.add_argument("--roles", nargs="+", choices=["default", "pick", "hand", "compile"],
                    default=["default", "pick", "hand", "compile"], help="what the re-time runs")  # fmt: skip
    ap.add_argument("--round-s", type=float, default=1.0,
                    help="re-time: seconds of interleaved rounds per setting (default 1)")  # fmt: skip
    ap.add_argument("--keep-work", action="store_true",
                    help="also write the advise runs' configs and trials files, as a .tgz")  # fmt: skip
    ap.add_argument("--profile", action="store_true",
                    help="profile every process of each advise run (cProfile: slower runs)")  # fmt: skip
    ap.add_argument("--space", help="advise's --space (a smoke run's short one)")
    ap.add_argument("--in-process", action="store_true", help="advise's --in-process")


def main(args: argparse.Namespace, command: str) -> int:
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError("no CUDA device here: nothing to measure (run it where a GPU is "
                             "lent, or pass --device cpu for a smoke run)")  # fmt: skip
    if args.model_file is not None and not args.model_file.is_file():
        raise UsageError(f"model file not found: {args.model_file}")
    out = args.out_dir
    extra = (*(("--space", args.space) if args.space else ()),
             *(("--in-process",) if args.in_process else ()))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="benchmarks-gpu-") as tmp:
        opts = plan_mod.Options(
            device=args.device, command=command, deadline_s=args.deadline_s, round_s=args.round_s,
            roles=tuple(args.roles), table=out / "runs.jsonl" if out else TABLE, extra=extra,
            commit=args.commit, keep_work=out / "gpu_work.tgz" if out and args.keep_work else None,
            profile=Path(tmp) / "profile" if args.profile else None, judge=targets)  # fmt: skip
        if args.check:
            return check(opts, out)
        opts.deadline_s = opts.deadline_s or DEADLINE_S
        parts = gpu_plan(args.only, args.efforts, not args.no_retime, args.model_file)
        rows = plan_mod.run_plan(parts, opts)
        if opts.profile is not None and out is not None:
            from benchmarks.studies import write_runs

            write_runs(sorted(p for p in opts.profile.iterdir() if p.is_dir()),
                       out / "gpu_profile.md", out / "gpu_profiles.tgz")  # fmt: skip
    for row in rows:
        met = {True: "met", False: "MISSED", None: "not measured"}
        print(f"{row['model']} {row['effort']}: " + "; ".join(
            f"{t['target']}: {t['value']}, {met[t['met']]}" for t in row.get("targets", [])))
    if out is not None:
        from benchmarks.pages import render_machine

        page = out / f"{rows[0]['machine']}.md" if rows else None
        if page is not None:
            page.write_text(render_machine(rows, head=None))
            print(f"[gpu] wrote {out / 'runs.jsonl'} and {page}")
    return 0
