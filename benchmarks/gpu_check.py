"""One call that proves the advisor's GPU path on a lent GPU, in under 9 minutes.

Runs, each in its own process under a share of one deadline, and writes what happened to
`benchmarks/results/gpu_check_<gpu>.md` (and the raw record beside it, .json) with the
environment (GPU, driver, CUDA, cuDNN, torch, Triton):

1. the CLI's default path on the GPU: `advisor advise advisor/examples/small_cnn.py --device cuda`
   (trials isolated in a worker process: gpu_audit #1 made every one of them fail);
2. the GPU tests: `pytest -m gpu tests/gpu` (before the max-autotune compile, whose cold
   start can take minutes, so that a short deadline still reaches them);
3. `advisor.apply(tuned.json, model)`, then the legacy TF32 getters and
   `torch.compile(model, mode="max-autotune")` (#2: they raised after apply), compared with eager;
4. one seed case of the suite (`seed_conv2d_3to16_infer`, short budgets).

Without a CUDA device it says so in one line and exits 2. On the device tool (docs/gpu-benchmarks.md
has the wheels to carry):

    python3 benchmarks/gpu_check.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

APPLY_COMPILE = r"""
import importlib.util, json, sys, torch
sys.path.insert(0, sys.argv[2])
import advisor
spec = importlib.util.spec_from_file_location("small_cnn", sys.argv[2] + "/advisor/examples/small_cnn.py")
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


def _environment() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    driver = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        driver = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        pass
    return {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gb": round(props.total_memory / 2**30, 1),
        "driver": driver,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
    }


def _run(name: str, cmd: list[str], timeout_s: float, **kw: Any) -> dict[str, Any]:
    """One step in its own process: ok (exit code 0) or failed, its seconds, its output's tail."""
    print(f"[gpu_check] {name}: {' '.join(cmd)[:200]}", flush=True)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                           env=env, **kw)  # fmt: skip
        status = "ok" if r.returncode == 0 else f"failed (exit code {r.returncode})"
        out, err = r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        status = f"timed out after {timeout_s:.0f} s"
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    seconds = time.perf_counter() - start
    print(f"[gpu_check] {name}: {status} in {seconds:.0f} s", flush=True)
    return {"step": name, "status": status, "seconds": round(seconds, 1),
            "stdout": out[-4000:], "stderr": err[-4000:]}  # fmt: skip


def run_checks(work: Path, deadline_s: float) -> list[dict[str, Any]]:
    start = time.perf_counter()
    py = sys.executable
    tuned = work / "tuned.json"
    # (name, command, its own time limit): each gets at most what is left of the deadline.
    plan: list[tuple[str, list[str], float]] = [
        ("CLI advise --device cuda (isolated)",
         [py, "-m", "advisor", "advise", "advisor/examples/small_cnn.py", "--device", "cuda",
          "--mode", "train", "--budget", "60", "--storage", "memory", "--out", str(tuned)], 150),
        ("GPU tests (pytest -m gpu tests/gpu)",
         [py, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
          "--durations=8"], 300),
        ("advisor.apply, legacy TF32 getters, torch.compile(max-autotune)",
         [py, "-c", APPLY_COMPILE, str(tuned), str(ROOT)], 180),
        ("suite: seed_conv2d_3to16_infer",
         [py, "benchmarks/suite.py", "--device", "cuda", "--only", "seed_conv2d_3to16_infer",
          "--advise-time", "30", "--timing-cap", "0.5", "--min-run-time", "0.2",
          "--compile-timeout", "120", "--out", str(work / "suite.md")], 240),
    ]  # fmt: skip
    steps = []
    for name, cmd, own in plan:
        left = deadline_s - (time.perf_counter() - start)
        if left < 20:
            steps.append({"step": name, "status": "not run: the deadline", "seconds": 0.0,
                          "stdout": "", "stderr": ""})  # fmt: skip
            continue
        steps.append(_run(name, cmd, min(own, left)))
    suite_md = work / "suite.md"
    if suite_md.exists():
        steps[-1]["report"] = suite_md.read_text()
    return steps


def render(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        f"# GPU check: {env['gpu']}",
        "",
        f"Command: `{data['command']}`, {data['date']}, {data['seconds']:.0f} s in all.",
        "",
        "| GPU | capability | memory | driver | CUDA | cuDNN | torch | Triton | Python |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {env['gpu']} | {env['capability']} | {env['memory_gb']} GB | {env['driver']} | "
        f"{env['cuda']} | {env['cudnn']} | {env['torch']} | {env['triton']} | {env['python']} |",
        "",
        "| step | result | seconds |",
        "|---|---|---:|",
    ]
    for s in data["steps"]:
        lines.append(f"| {s['step']} | {s['status']} | {s['seconds']:.0f} |")
    for s in data["steps"]:
        lines += ["", f"## {s['step']}: {s['status']}", ""]
        if s.get("report"):
            lines += [s["report"].strip(), ""]
        tail = (s["stdout"].strip() + "\n" + s["stderr"].strip()).strip()
        if tail:
            lines += ["<details><summary>output (tail)</summary>", "", "```",
                      tail[-3000:], "```", "", "</details>"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--deadline-s", type=float, default=520.0,
                    help="stop starting steps after this many seconds (default 520)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here: nothing to check (run it where a GPU is lent)",
              file=sys.stderr)  # fmt: skip
        return 2
    start = time.perf_counter()
    env = _environment()
    with tempfile.TemporaryDirectory() as tmp:
        steps = run_checks(Path(tmp), args.deadline_s)
    data = {
        "command": "python benchmarks/gpu_check.py"
        + "".join(f" {a}" for a in (argv or sys.argv[1:])),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": time.perf_counter() - start,
        "environment": env,
        "steps": steps,
    }
    slug = re.sub(r"[^a-z0-9]+", "_", env["gpu"].lower()).strip("_")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    md = args.out_dir / f"gpu_check_{slug}.md"
    md.write_text(render(data))
    md.with_suffix(".json").write_text(json.dumps(data, indent=1))
    print(f"[gpu_check] wrote {md}")
    return 0 if all(s["status"] == "ok" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
