"""Tune model files, then re-time each config independently in a fresh process.

For each model file: `advisor.advise` (train mode by default) writes a config; a FRESH process
applies PyTorch's default, the advisor's pick, "everything on" and (when the pick has per-layer
implementations) the pick without them, each with `advisor.apply` to its own copy of the model,
checks outputs and gradients against the untuned fp32 model, and times the steps interleaved with
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
import numpy as np
import torch
import torch.utils.benchmark as tb
import advisor
from advisor.config import load_config
from advisor.knobs import GlobalFlags
from advisor.runner import settle_cpu_allocator
from advisor.workload import model_workload
warnings.simplefilter("ignore")
settle_cpu_allocator()  # every setting timed from the allocator state of a running training loop
cfg_path, target, mode, device, variants_json = sys.argv[1:6]
dev = torch.device(device)
cfg = load_config(cfg_path)
variants = {name: cfg.model_copy(update={"settings": advisor.Settings.model_validate(s)})
            for name, s in json.loads(variants_json).items()}
w = model_workload(target)
x = w.make_inputs(dev, seed=7)
base = w.make_model().to(dev).train(mode == "train")
torch.manual_seed(0)
with torch.enable_grad():
    ref = base(*x)
g = torch.randn(ref.shape, device=dev)
(ref.float() * g).sum().backward()
ref_grads = torch.cat([p.grad.float().flatten() for p in base.parameters() if p.grad is not None])

def step(tuned, inputs):
    def f():
        if mode == "infer":
            with torch.no_grad(), tuned.autocast():
                tuned.model(*inputs)
            return
        tuned.model.zero_grad(set_to_none=True)
        with tuned.autocast():
            out = tuned.model(*inputs)
        (out.float() * g).sum().backward()
    return f

runs, errors = {}, {}
for name, c in variants.items():  # each variant on its own copy of the model (same weights)
    tuned = advisor.apply(c, w.make_model().train(mode == "train"), device=dev)
    xt = tuned.inputs(*x)
    with tuned.autocast():
        out = tuned.model(*xt)
    (out.float() * g).sum().backward()
    grads = torch.cat([p.grad.float().flatten() for p in tuned.model.parameters() if p.grad is not None])
    errors[name] = (((out.float() - ref).norm() / ref.norm()).item(),
                    ((grads - ref_grads).norm() / ref_grads.norm()).item())
    runs[name] = (tuned, step(tuned, xt))
    tuned.restore()

# Interleaved rounds in alternating order (A B C, C B A, ...): drift hits every variant alike.
samples = {name: [] for name in runs}
order = list(runs)
for r in range(6):
    for name in (order if r % 2 == 0 else order[::-1]):
        tuned, f = runs[name]
        GlobalFlags.switch_to(tuned.settings)
        m = tb.Timer(stmt="f()", globals={"f": f},
                     num_threads=torch.get_num_threads()).blocked_autorange(min_run_time=0.5)
        samples[name] += [t * 1e3 for t in m.times]
out = {name: {"median_ms": float(np.median(s)),
              "iqr_ms": float(np.subtract(*np.percentile(s, [75, 25]))),
              "err": errors[name][0], "grad_err": errors[name][1]} for name, s in samples.items()}
out["layers"] = runs["advisor"][0].layer_impls
print(json.dumps(out))
"""


def everything_on(device: str) -> dict[str, object]:
    """What a "switch everything on" helper does: channels_last + AMP (+ TF32, cudnn.benchmark)."""
    if device.startswith("cuda"):
        return {"memory_format": "channels_last", "amp": "fp16", "tf32": "on",
                "cudnn_benchmark": True}  # fmt: skip
    return {"memory_format": "channels_last", "amp": "bf16"}


def _cell(v: dict[str, float] | None) -> str:
    return f"{v['median_ms']:.2f} ({v['iqr_ms']:.2f})" if v else "-"


def _ratio(v: dict[str, float] | None, advisor_: dict[str, float]) -> str:
    return f"{v['median_ms'] / advisor_['median_ms']:.2f}x" if v else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="train", choices=["infer", "train"])
    ap.add_argument("--out")
    args = ap.parse_args()

    import advisor
    from advisor.knobs import Settings

    env = advisor.current_environment(args.device)
    lines = [
        "# Tuned model files re-timed in a fresh process",
        "",
        f"Device: {env.device_name} ({env.device_type}), {env.cpu_threads} threads; torch {env.torch}"
        f"; CUDA {env.cuda}; cuDNN {env.cudnn}; fingerprint {env.fingerprint}.",
        f"Mode: {args.mode}. Each setting applied with `advisor.apply` to its own copy of the model "
        "in one fresh process, then timed with torch.utils.benchmark in 6 interleaved rounds "
        "(alternating order, >= 0.5 s per round): median ms (IQR). Ratios are the other setting's "
        'time / the advisor\'s. "everything on": '
        + json.dumps(everything_on(args.device)).replace('"', "")
        + '; "pick w/o layers": the advisor\'s global settings without its per-layer choices. '
        "Errors: outputs / gradients relative to the untuned fp32 model.",
        "",
        "| model | advisor's pick | default ms | advisor ms | everything-on ms | pick w/o layers ms "
        "| default / advisor | everything-on / advisor | w/o layers / advisor | advisor error "
        "| tuning s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.models:
            t0 = time.perf_counter()
            advice = advisor.advise(model_file=target, mode=args.mode, device=args.device)
            tuning = time.perf_counter() - t0
            cfg = Path(tmp) / "tuned.json"
            advice.save(cfg, trials_csv=False)
            picked = advice.settings.model_dump(mode="json")
            variants = {
                "default": {},
                "advisor": picked,
                "everything_on": everything_on(args.device),
            }
            if advice.settings.layers:
                variants["without_layers"] = {**picked, "layers": {}}
            r = subprocess.run(
                [sys.executable, "-c", RETIME, str(cfg), target, args.mode, args.device,
                 json.dumps(variants)],
                capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            if r.returncode != 0:
                print(f"| {target} | re-time failed: {r.stderr.strip().splitlines()[-1]} |")
                continue
            t = json.loads(r.stdout)
            names = ("default", "advisor", "everything_on", "without_layers")
            cells = " | ".join(_cell(t.get(n)) for n in names)
            ratios = " | ".join(_ratio(t.get(n), t["advisor"]) for n in names if n != "advisor")
            label = advice.settings.label()
            if Settings.model_validate(variants["everything_on"]) == advice.settings:
                label += " (= everything on: that pair shows the noise)"
            row = (
                f"| {Path(target).name} | {label} | {cells} | {ratios} "
                f"| {t['advisor']['err']:.1e} / {t['advisor']['grad_err']:.1e} | {tuning:.0f} |"
            )
            lines.append(row)
            print(row, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
