"""Issue 55's acceptance on an H100/H200, in one call under 9 minutes: tables and targets.

Runs, as a new user would, `advisor advise MODEL --mode train --device cuda --effort E
--storage memory` (each in its own process, timed end to end) on:

- advisor/examples/small_cnn.py, quick and default effort;
- torchvision ResNet-50 at 32 x 224² (benchmarks/models/tv_resnet50.py), quick and default;
- torchvision R(2+1)D-18 at 8 x 16 x 112² (benchmarks/models/tv_r2plus1d_18.py), quick: a
  published video network with factorised Conv3d ((1,3,3) then (3,1,1)). The bundled
  advisor/examples/video_cnn.py has that factorisation too, but it is a three-layer toy at
  2 x 4 x 16 x 48², not a published network.

For each model, then, fresh processes re-time PyTorch's default, each effort's pick (from the
config it wrote), the hand setting (channels_last + bf16 autocast + cudnn.benchmark) and
`torch.compile` (default mode) of the untouched model: a process of its own each, empty compile
caches, first calls timed apart (the cold compile, cuDNN's search), then interleaved rounds
(benchmarks/process_retime.py). Each run gets a table: wall time, harness share (the advisor's
own breakdown; the gate's checks counted apart, as advise_walltime.py counts them), pick, final
check, and the re-time; and the issue's targets are checked (gpu_acceptance_report.py).

The deadline (530 s by default) is shared by the parts in proportion to PLAN's seconds (shares,
not measurements): a part that finishes early leaves its time to the next; one that runs out
is stopped (an advise gets Ctrl-C first, so it writes the answer it has) and recorded as such.
Output: `gpu_acceptance_<gpu>.md` and `.json` in --out-dir, rewritten after every part;
`--profile` adds `_profile.md` and `_profiles.tgz` (benchmarks/profile_summary.py). Without
a CUDA device it says so in one line and exits 2. On the device tool (docs/gpu-benchmarks.md):

    python3 benchmarks/gpu_acceptance.py --out-dir $OUT --commit <sha>
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

from advise_walltime import _label  # noqa: E402
from gpu_acceptance_report import evaluate, render  # noqa: E402
from process_retime import retime_in_processes  # noqa: E402
from profile_summary import write_runs  # noqa: E402
from zoo import _env, _last_line, _shown_path, environment, missing  # noqa: E402

from advisor.execute.profiling import ENV as PROFILE_ENV  # noqa: E402
from advisor.knobs import Settings  # noqa: E402

MODELS = {
    "small_cnn": ROOT / "advisor" / "examples" / "small_cnn.py",
    "tv_resnet50": HERE / "models" / "tv_resnet50.py",
    "tv_r2plus1d_18": HERE / "models" / "tv_r2plus1d_18.py",
}
# The hand setting, and torch.compile of the untouched model (fresh_retime's rival)
HAND = {"memory_format": "channels_last", "amp": "bf16", "cudnn_benchmark": True}
COMPILE = {"compile": "default"}
VARIANTS = ("default", "pick", "hand", "compile")
GRACE_S = 10.0  # after Ctrl-C, for the advisor to write its answer


@dataclass(frozen=True)
class Part:
    kind: str  # "advise" or "retime"
    model: str
    effort: str | None  # advise's --effort
    share_s: float  # its planned seconds: the deadline is split in proportion to these
    target_s: float | None = None  # issue 55's wall-time target for an advise run

    @property
    def name(self) -> str:
        return f"{self.model} {self.effort}" if self.kind == "advise" else f"{self.model} re-time"


# Quick runs first (the cheapest answers), each model's re-time once its last run is done. The
# advise shares are the targets (a run that meets its target is never stopped while the
# parts before met theirs); the re-time shares are guesses, sized to fit 530 s.
PLAN = (
    Part("advise", "small_cnn", "quick", 20, 20),
    Part("advise", "tv_resnet50", "quick", 45, 45),
    Part("advise", "tv_r2plus1d_18", "quick", 45, 45),
    Part("retime", "tv_r2plus1d_18", None, 45),
    Part("advise", "small_cnn", "default", 90, 90),
    Part("retime", "small_cnn", None, 35),
    Part("advise", "tv_resnet50", "default", 180, 180),
    Part("retime", "tv_resnet50", None, 60),
)


def limit_for(left_s: float, share_s: float, later_s: float) -> float:
    """A part's time: what is left less the later parts' shares where that is more than its
    own share (the parts before finished early), else its share of what is left in proportion
    (they ran late)."""
    return max(left_s - later_s, left_s * share_s / (share_s + later_s), 0.0)


# ======================================================================== one advise run


def advise(model: Path, name: str, effort: str, device: str, limit_s: float, work: Path,
           extra: list[str], env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """`advisor advise` in a subprocess, timed end to end, stopped like Ctrl-C after
    `limit_s`; what its config says (the pick, the breakdown, the final check, the verdicts)."""
    cfg = work / f"{name}.{effort}.json"
    cmd = [sys.executable, "-m", "advisor", "advise", str(model), "--mode", "train", "--device",
           device, "--effort", effort, "--storage", "memory", "--out", str(cfg), *extra]  # fmt: skip
    shown = shlex.join(cmd[3:]).replace(str(ROOT) + "/", "").replace(str(work) + "/", "")
    run: dict[str, Any] = {"command": f"advisor {shown}"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=env, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        run["stopped_s"] = time.perf_counter() - t0
        with contextlib.suppress(ProcessLookupError):  # Ctrl-C, to its whole process group
            os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    run["wall_s"] = time.perf_counter() - t0
    run["exit_code"] = proc.returncode
    run["output_tail"] = out[-3000:]
    with contextlib.suppress(ProcessLookupError):  # its workers, had any outlived it
        os.killpg(proc.pid, signal.SIGKILL)
    if not cfg.exists():
        run["error"] = _last_line(out) if "stopped_s" not in run else "no answer written"
        return run
    data = json.loads(cfg.read_text())
    res = data.get("result") or {}
    run.update(config=str(cfg), settings=data["settings"], pick=_label(data["settings"]),
               **{k: res.get(k) for k in ("stage_s", "final_check", "precisions", "notes", "why",
                                          "speedup", "speedup_ci", "benchmark_note",
                                          "compile_note", "payback", "answer", "warnings")})  # fmt: skip
    run.update(_trials(cfg.with_suffix(".trials.csv")))
    return run


def _trials(path: Path) -> dict[str, Any]:
    """From the trials file: the reasons that say the budget stopped something, and what
    became of each bf16 candidate (issue 56: bf16 accepted on ResNet-50)."""
    if not path.exists():
        return {}
    with path.open() as f:
        rows = list(csv.DictReader(f))
    bf16: dict[str, int] = {}
    for r in rows:
        if r.get("amp") == "bf16":
            bf16[r.get("status", "?")] = bf16.get(r.get("status", "?"), 0) + 1
    budget = sorted({r["reason"] for r in rows if "budget ran out" in (r.get("reason") or "")})
    return {"bf16_trials": bf16, "budget_reasons": budget}


# ======================================================================== one model's re-time


def retime_model(model: Path, runs: list[dict[str, Any]], device: str, limit_s: float,
                 variants: tuple[str, ...], round_s: float) -> dict[str, Any]:  # fmt: skip
    """The model's re-time: one process per distinct setting (a pick equal to the default or
    to the other run's pick shares its process), `roles` saying which process stands for
    what ("pick quick" -> "default", say)."""
    wanted: dict[str, dict[str, Any]] = {}
    if "default" in variants:
        wanted["default"] = {}
    if "pick" in variants:
        for run in runs:
            if "settings" in run:
                wanted[f"pick {run['effort']}"] = run["settings"]
    if "hand" in variants:
        wanted["hand"] = HAND
    procs: dict[str, dict[str, Any]] = {}
    roles: dict[str, str] = {}
    for role, settings in wanted.items():
        same = next((n for n, s in procs.items() if Settings.model_validate(s)
                     == Settings.model_validate(settings)), None)  # fmt: skip
        roles[role] = same or role.replace(" ", "_")
        if same is None:
            procs[roles[role]] = settings
    if "compile" in variants:  # a rival: torch.compile by hand, never the same as a Settings
        procs["compile"] = COMPILE
        roles["compile"] = "compile"
    t0 = time.perf_counter()
    result = retime_in_processes(model, procs, "train", device, t0 + limit_s, round_s)
    return {"limit_s": limit_s, "seconds": time.perf_counter() - t0, "variants": procs,
            "roles": roles, "result": result}  # fmt: skip


# ======================================================================== the whole run


def _commit(given: str | None) -> str:
    if given:
        return given
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, timeout=30, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "advisor", "benchmarks",
                                "search_spaces"], cwd=ROOT, timeout=30).returncode  # fmt: skip
        return sha + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git here: pass --commit)"


def _write(data: dict[str, Any], out_dir: Path, slug: str) -> Path:
    data["targets"] = evaluate(data)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"gpu_acceptance_{slug}.md"
    md.write_text(render(data))
    md.with_suffix(".json").write_text(json.dumps(data, indent=1))
    return md


def _keep(work: Path, tgz: Path) -> None:
    """The advise runs' configs and trials files (where the time went, trial by trial), without
    the compile caches: the device tool brings back a few small files."""
    with tarfile.open(tgz, "w:gz") as tar:
        for f in sorted(work.glob("*")):
            if f.is_file():
                tar.add(f, arcname=f.name)


def run_acceptance(plan: list[Part], models: dict[str, Path], args: argparse.Namespace,
                   argv: list[str]) -> tuple[dict[str, Any], Path]:  # fmt: skip
    """Every part of `plan` within `args.deadline_s`, the report rewritten after each."""
    start = time.perf_counter()
    machine = environment(args.device)
    slug = "cpu"
    if machine.get("device_type") == "cuda":
        slug = re.sub(r"[^a-z0-9]+", "_", str(machine.get("device_name")).lower()).strip("_")
    data: dict[str, Any] = {
        "command": "python benchmarks/gpu_acceptance.py " + shlex.join(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(args.commit), "environment": machine, "deadline_s": args.deadline_s,
        "variants": list(args.variants), "round_s": args.round_s,
        "plan": [asdict(p) for p in plan], "runs": [], "retimes": {}, "parts": [],
    }  # fmt: skip
    extra = [*(["--space", args.space] if args.space else []),
             *(["--in-process"] if args.in_process else [])]  # fmt: skip
    print(f"[acceptance] {machine.get('device_name')} | torch {machine.get('torch')} | "
          f"deadline {args.deadline_s:.0f} s", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-") as tmp:
        work = Path(tmp)
        # One fresh cache folder for the advise runs, as a new user's machine: nothing reused
        # from an earlier run of this script, what one run leaves the next reads.
        child_env = _env({var: str(work / "caches" / sub) for var, sub in (
            ("ADVISOR_CACHE_DIR", "advisor"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
            ("TRITON_CACHE_DIR", "triton"))})  # fmt: skip
        profiled: list[Path] = []  # --profile: each advise run's $ADVISOR_PROFILE_DIR
        for i, part in enumerate(plan):
            left = args.deadline_s - (time.perf_counter() - start)
            limit = limit_for(left, part.share_s, sum(p.share_s for p in plan[i + 1 :]))
            record: dict[str, Any] = {"part": part.name, "limit_s": round(limit, 1)}
            why = missing_reason(models[part.model])
            if why or limit < 5:
                record["status"] = f"skipped: {why}" if why else "not run: the deadline"
                if part.kind == "advise":
                    data["runs"].append({**asdict(part), "file": _shown_path(models[part.model]),
                                         "error": record["status"]})  # fmt: skip
                print(f"[acceptance] {part.name}: {record['status']}", flush=True)
            elif part.kind == "advise":
                assert part.effort is not None
                print(f"[acceptance] {part.name}: advise, {limit:.0f} s at most", flush=True)
                env = child_env
                if args.profile:
                    profiled.append(work / "profile" / f"{part.model}_{part.effort}")
                    env = {**child_env, PROFILE_ENV: str(profiled[-1])}
                run = {**asdict(part), "file": _shown_path(models[part.model]), "limit_s": limit,
                       **advise(models[part.model], part.model, part.effort, args.device, limit,
                                work, extra, env)}  # fmt: skip
                data["runs"].append(run)
                if args.profile:  # the runs so far: tables, and the .prof files in a .tgz
                    run["profile"] = profiled[-1].name
                    write_runs(profiled, args.out_dir / f"gpu_acceptance_{slug}_profile.md",
                               args.out_dir / f"gpu_acceptance_{slug}_profiles.tgz")  # fmt: skip
                record["status"] = run.get("error") or (
                    "stopped at its share" if "stopped_s" in run else "ok"
                )
                print(f"[acceptance] {part.name}: {run['wall_s']:.1f} s, "
                      f"{run.get('pick', run.get('error'))}", flush=True)  # fmt: skip
            else:
                runs = [r for r in data["runs"] if r["model"] == part.model]
                print(f"[acceptance] {part.name}: {limit:.0f} s at most", flush=True)
                rt = retime_model(models[part.model], runs, args.device, limit,
                                  tuple(args.variants), args.round_s)  # fmt: skip
                data["retimes"][part.model] = rt
                record["status"] = "ok"
            record["seconds"] = round(time.perf_counter() - start, 1)
            data["parts"].append(record)
            data["seconds"] = time.perf_counter() - start
            md = _write(data, args.out_dir, slug)
            if args.keep_work:
                _keep(work, args.out_dir / f"gpu_acceptance_{slug}_work.tgz")
    print(f"[acceptance] wrote {md} ({data['seconds']:.0f} s)", flush=True)
    return data, md


def missing_reason(path: Path) -> str | None:
    from zoo import ZooModel

    return missing(ZooModel(path.stem, path))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=530.0,
        help="every part ends by then (default 530: 9 minutes with set-up)",
    )
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run")
    ap.add_argument("--commit", help="the commit the tree is at (the device tool has no git)")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="MODEL",
        choices=sorted(MODELS),
        help="the plan's parts for these models alone",
    )
    ap.add_argument(
        "--model-file",
        type=Path,
        help="instead of the plan: this model file at --efforts, then its re-time",
    )
    ap.add_argument("--efforts", nargs="+", choices=["quick", "default"],
                    help="the plan's advise runs at these efforts alone (--model-file: quick)")
    ap.add_argument("--no-retime", action="store_true",
                    help="no re-time parts: their time goes to the advise runs")
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="what the re-time runs (default: all)",
    )
    ap.add_argument(
        "--round-s",
        type=float,
        default=1.0,
        help="re-time: seconds of interleaved rounds per variant (default 1)",
    )
    ap.add_argument("--keep-work", action="store_true",
                    help="also write the advise runs' configs and trials files as a .tgz")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile every process of each advise run (cProfile: slower runs)",
    )
    ap.add_argument("--space", help="advise's --space (a smoke run's short one)")
    ap.add_argument("--in-process", action="store_true", help="advise's --in-process")
    args = ap.parse_args(argv)  # fmt: skip
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("gpu_acceptance: no CUDA device here: nothing to accept (run it where a GPU "
                  "is lent, or pass --device cpu for a smoke run)", file=sys.stderr)  # fmt: skip
            return 2
    models = dict(MODELS)
    plan = [p for p in PLAN if (not args.only or p.model in args.only)
            and (p.kind == "retime" or not args.efforts or p.effort in args.efforts)]  # fmt: skip
    if args.model_file:
        name = args.model_file.stem
        models = {name: args.model_file.resolve()}
        efforts = args.efforts or ["quick"]
        share = args.deadline_s / (len(efforts) + 1)
        plan = [*(Part("advise", name, e, share) for e in efforts),
                Part("retime", name, None, share)]  # fmt: skip
    if args.no_retime:
        plan = [p for p in plan if p.kind == "advise"]
    run_acceptance(plan, models, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
