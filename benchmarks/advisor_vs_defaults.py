"""PyTorch's default vs the advisor's pick vs "everything on", for the seeds' layers.

For each case the advisor tunes the layer (the full default search space for the device), saves
its config, and then a FRESH process applies that config with `advisor.apply` and re-times it
independently with `torch.utils.benchmark` against PyTorch's defaults and against switching
everything on (channels_last + AMP, plus TF32 and cudnn.benchmark on CUDA). Prints a markdown
table of ratios and writes it to --out.

    python benchmarks/advisor_vs_defaults.py --device cpu --out benchmarks/results/advisor_vs_defaults_cpu.md
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

# (name, layer, input shape on CPU, input shape on CUDA, mode) — the seeds' shapes, scaled to a CPU.
CASES = [
    (
        "seed: 3->16 conv on a big image",
        "Conv2d(3, 16, 3, padding=1)",
        "1,3,512,512",
        "1,3,1024,1024",
        "infer",
    ),
    (
        "seed: depthwise ConvTranspose2d 2x2/2",
        "ConvTranspose2d(256, 256, 2, stride=2, groups=256, bias=False)",
        "16,256,16,16",
        "64,2048,16,16",
        "infer",
    ),
    (
        "seed: Conv3d (1,3,3) train",
        "Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False)",
        "2,2,50,64,64",
        "8,2,500,64,64",
        "train",
    ),
    (
        "seed: Conv2d 512->1024 (scaled)",
        "Conv2d(64, 128, 3)",
        "2,64,64,128",
        "5,512,128,256",
        "infer",
    ),
]

RETIME = r"""
import json, sys, warnings
import torch
import torch.utils.benchmark as tb
import advisor
from advisor.workload import layer_spec
warnings.simplefilter("ignore")
from advisor.runner import settle_cpu_allocator
settle_cpu_allocator()  # every setting timed from the allocator state of a running training loop
cfg_path, layer, shape, mode, device = sys.argv[1:6]
spec = layer_spec(layer, input_shape=shape)
dev = torch.device(device)

def make_step(tuned=None, amp=None, channels_last=False):
    model = spec.construct().to(dev)
    x = torch.randn(spec.input_shape, device=dev)
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    if tuned is not None:
        model = tuned(model)
        (x,) = model.inputs(x)
        ctx, net = model.autocast, model.model
    else:
        if channels_last:
            model = model.to(memory_format=fmt)
            x = x.contiguous(memory_format=fmt)
        net = model
        ctx = (lambda: torch.autocast(dev.type, dtype=amp)) if amp else (lambda: torch.autocast(dev.type, enabled=False))
    g = None
    def step():
        nonlocal g
        if mode == "infer":
            with torch.no_grad(), ctx():
                net(x)
        else:
            net.zero_grad(set_to_none=True)
            with ctx():
                y = net(x)
            if g is None:
                g = torch.randn(y.shape, device=dev)
            (y.float() * g).sum().backward()
    return step

def timeit(step):
    t = tb.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
    m = t.blocked_autorange(min_run_time=1.0)
    return {"median_ms": m.median * 1e3, "iqr_ms": m.iqr * 1e3, "runs": len(m.raw_times)}

out = {}
out["default"] = timeit(make_step())
out["advisor"] = timeit(make_step(tuned=lambda m: advisor.apply(cfg_path, m)))
if dev.type == "cuda":
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
everything_amp = torch.float16 if dev.type == "cuda" else torch.bfloat16
out["everything_on"] = timeit(make_step(amp=everything_amp, channels_last=True))
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="markdown file to write the table to")
    ap.add_argument("--only", type=int, nargs="*", help="case indices to run")
    args = ap.parse_args()

    import torch

    import advisor

    env = advisor.current_environment(args.device)
    lines = [
        "# Advisor vs PyTorch defaults vs everything on",
        "",
        f"Device: {env.device_name} ({env.device_type}), {env.cpu_threads} threads; torch {env.torch}"
        f"; CUDA {env.cuda}; cuDNN {env.cudnn}; fingerprint {env.fingerprint}.",
        "Timed in a fresh process with torch.utils.benchmark (blocked_autorange, >= 1 s per "
        "setting) after `advisor.apply`; ratios are PyTorch default time / setting time.",
        "",
        "| case | mode | input | advisor's pick | default ms | advisor ms | everything-on ms "
        "| advisor vs default | everything-on vs default | tuning s |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    print("\n".join(lines), flush=True)
    cuda = torch.device(args.device).type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, layer, cpu_shape, gpu_shape, mode) in enumerate(CASES):
            if args.only and i not in args.only:
                continue
            shape = gpu_shape if cuda else cpu_shape
            t0 = time.perf_counter()
            advice = advisor.advise(layer=layer, input_shape=shape, mode=mode, device=args.device)
            tuning = time.perf_counter() - t0
            cfg = Path(tmp) / f"case{i}.json"
            advice.save(cfg, trials_csv=False)
            r = subprocess.run(
                [sys.executable, "-c", RETIME, str(cfg), layer, shape, mode, args.device],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if r.returncode != 0:
                print(
                    f"| {name} | {mode} | {shape} | re-time failed: {r.stderr.strip().splitlines()[-1]} |"
                )
                continue
            t = json.loads(r.stdout)
            d, a, e = (t[k]["median_ms"] for k in ("default", "advisor", "everything_on"))
            row = (
                f"| {name} | {mode} | {shape} | {advice.settings.label()} | {d:.3f} | {a:.3f} | "
                f"{e:.3f} | {d / a:.2f}x | {d / e:.2f}x | {tuning:.0f} |"
            )
            lines.append(row)
            print(row, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
