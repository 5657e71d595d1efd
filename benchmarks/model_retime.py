"""Tune model files, then re-time each config independently in a fresh process.

For each model file: `advisor.advise` (train mode by default) writes a config; a FRESH process
builds the model twice (same weights), applies the config to one with `advisor.apply`, checks
outputs and gradients against the untuned model, and times both training steps with
`torch.utils.benchmark`. Prints a markdown table and writes it to --out.

    python benchmarks/model_retime.py advisor/examples/video_cnn.py advisor/examples/small_cnn.py \
        --device cpu --out benchmarks/results/model_retime_cpu.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RETIME = r"""
import json, sys, warnings
import torch
import torch.utils.benchmark as tb
import advisor
from advisor.workload import model_workload
warnings.simplefilter("ignore")
from advisor.runner import settle_cpu_allocator
settle_cpu_allocator()  # every setting timed from the allocator state of a running training loop
cfg_path, target, mode, device = sys.argv[1:5]
dev = torch.device(device)
w = model_workload(target)
x = w.make_inputs(dev, seed=7)
base = w.make_model().to(dev).train(mode == "train")
model = w.make_model().train(mode == "train")
tuned = advisor.apply(cfg_path, model, device=dev)
xt = tuned.inputs(*x)

def run(net, inputs, ctx):
    with ctx():
        out = net(*inputs)
    return out

def grads(net):
    return torch.cat([p.grad.float().flatten() for p in net.parameters() if p.grad is not None])

torch.manual_seed(0)
ref = run(base, x, torch.enable_grad)
g = torch.randn(ref.shape, device=dev)
(ref.float() * g).sum().backward()
torch.manual_seed(0)
out = run(model, xt, tuned.autocast)
(out.float() * g).sum().backward()
err = ((out.float() - ref).norm() / ref.norm()).item()
gerr = ((grads(model) - grads(base)).norm() / grads(base).norm()).item()

def step(net, inputs, ctx):
    def f():
        if mode == "infer":
            with torch.no_grad():
                run(net, inputs, ctx)
            return
        net.zero_grad(set_to_none=True)
        (run(net, inputs, ctx).float() * g).sum().backward()
    return f

def timeit(f):
    m = tb.Timer(stmt="f()", globals={"f": f}, num_threads=torch.get_num_threads()).blocked_autorange(min_run_time=2.0)
    return m.median * 1e3, m.iqr * 1e3
tuned.restore()
d = timeit(step(base, x, torch.enable_grad))
tuned = advisor.apply(cfg_path, model, device=dev)
a = timeit(step(model, xt, tuned.autocast))
print(json.dumps({"default": d, "advisor": a, "err": err, "grad_err": gerr, "layers": tuned.layer_impls}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--out")
    args = ap.parse_args()

    import advisor

    env = advisor.current_environment(args.device)
    lines = [
        "# Tuned model files re-timed in a fresh process",
        "",
        f"Device: {env.device_name} ({env.device_type}), {env.cpu_threads} threads; torch {env.torch}"
        f"; CUDA {env.cuda}; cuDNN {env.cudnn}; fingerprint {env.fingerprint}.",
        f"Mode: {args.mode}. Re-timed with torch.utils.benchmark (blocked_autorange, >= 2 s each) "
        "after `advisor.apply`; outputs and gradients compared with the untuned model.",
        "",
        "| model | advisor's pick | per-layer impls | default ms (IQR) | advisor ms (IQR) | speedup "
        "| out rel err | grad rel err | tolerance | tuning s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.models:
            t0 = time.perf_counter()
            advice = advisor.advise(model_file=target, mode=args.mode, device=args.device)
            tuning = time.perf_counter() - t0
            cfg = Path(tmp) / "tuned.json"
            advice.save(cfg, trials_csv=False)
            r = subprocess.run(
                [sys.executable, "-c", RETIME, str(cfg), target, args.mode, args.device],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if r.returncode != 0:
                print(f"| {target} | re-time failed: {r.stderr.strip().splitlines()[-1]} |")
                continue
            t = json.loads(r.stdout)
            (d, di), (a, ai) = t["default"], t["advisor"]
            impls = ", ".join(f"{k}={v}" for k, v in t["layers"].items() if v != "native") or "-"
            res = advice.config.result
            row = (
                f"| {Path(target).name} | {advice.settings.label()} | {impls} | {d:.2f} ({di:.2f}) "
                f"| {a:.2f} ({ai:.2f}) | {d / a:.2f}x | {t['err']:.1e} | {t['grad_err']:.1e} | "
                f"{res.tolerance:.0e} / {res.grad_error is not None and advice.best.grad_tolerance or 0:.0e} "
                f"| {tuning:.0f} |"
            )
            lines.append(row)
            print(row, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
