"""Does torch.compile on a CPU give a model's contiguous and channels_last forms the same speed?

On a CPU with oneDNN, Inductor's layout optimisation runs every conv of a graph in
channels_last whatever layout the model has. Compiled from contiguous weights, the graph then
converts every conv weight (and its gradient) at each step; the channels_last form does not.
`advisor.stages.compiling.channels_last_twin` relies on this to compile a contiguous candidate as
its channels_last twin (one cold compile where there were two). This script measures it: for each
model and mode, in a fresh process, both forms are compiled (default mode, one Inductor cache
folder per process) and timed interleaved, round by round (3 steps a sample, alternating order),
with fresh random inputs. The ratio is per round (contiguous / channels_last: above 1.0x the
channels_last form is faster), with its quartiles. The second form's first call shows how much
of the first's compile it reused (the same kernels).

    python benchmarks/compile_layout.py --models small_cnn relu_bn_block mobilenet_v3_small \
        --modes train infer --out benchmarks/results/compile_layout_cpu.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROUNDS = 40
STEPS_PER_SAMPLE = 3


def _measure(path: str, mode: str) -> dict[str, Any]:
    """In this process: both forms compiled, then timed interleaved."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("model_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    steps, first_s = {}, {}
    for form in ("contiguous", "channels_last"):
        torch.manual_seed(0)
        model = module.build_model()
        x = torch.randn_like(module.example_inputs()[0])
        if form == "channels_last":
            fmt = torch.channels_last_3d if x.dim() == 5 else torch.channels_last
            model = model.to(memory_format=fmt)
            x = x.contiguous(memory_format=fmt)
        model.train(mode == "train")
        compiled = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)

        def step(compiled: Any = compiled, x: torch.Tensor = x, opt: Any = opt) -> None:
            if mode == "infer":
                with torch.no_grad():
                    compiled(x)
                return
            opt.zero_grad(set_to_none=True)
            compiled(x).float().sum().backward()
            opt.step()

        t0 = time.perf_counter()
        step()
        first_s[form] = time.perf_counter() - t0
        for _ in range(3):  # warm-up
            step()
        steps[form] = step
    samples: dict[str, list[float]] = {form: [] for form in steps}
    for r in range(ROUNDS):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for form in order:
            t0 = time.perf_counter()
            for _ in range(STEPS_PER_SAMPLE):
                steps[form]()
            samples[form].append((time.perf_counter() - t0) / STEPS_PER_SAMPLE * 1e3)
    return {"first_call_s": first_s, "samples_ms": samples}


def _row(name: str, mode: str, data: dict[str, Any]) -> str:
    s = data["samples_ms"]
    ratios = sorted(a / b for a, b in zip(s["contiguous"], s["channels_last"], strict=True))
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    first = data["first_call_s"]
    return (
        f"| {name} | {mode} | {statistics.median(s['contiguous']):.3f} | "
        f"{statistics.median(s['channels_last']):.3f} | {med:.3f}x [{q1:.3f}, {q3:.3f}] | "
        f"{first['contiguous']:.1f} | {first['channels_last']:.1f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["small_cnn", "relu_bn_block"])
    parser.add_argument("--modes", nargs="+", default=["train"], choices=["train", "infer"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_measure(*args.child)))
        return 0
    from advise_walltime import _environment_line, _model_path

    lines = [
        "# torch.compile: contiguous vs channels_last forms of a model, on this CPU",
        "",
        _environment_line("cpu"),
        "",
        f"Command: `python benchmarks/compile_layout.py {' '.join(sys.argv[1:])}`",
        "",
        f"Each row a fresh process: both forms compiled (Inductor default mode, one cache folder "
        f"for the process), then {ROUNDS} interleaved rounds of {STEPS_PER_SAMPLE} steps per "
        "sample. Ratio: contiguous / channels_last per round, median [quartiles]; above 1.0x "
        "the channels_last form is faster. First call: the compile (the second form's reuses "
        "the first's kernels).",
        "",
        "| model | mode | contiguous ms | channels_last ms | ratio | first call s (contiguous) "
        "| first call s (channels_last) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in args.models:
        path = _model_path(name)
        for mode in args.modes:
            with tempfile.TemporaryDirectory(prefix="compile-layout-") as cache:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(path), mode],
                    capture_output=True,
                    text=True,
                    env={**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": cache},
                    check=False,
                )
            if out.returncode != 0:
                tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
                lines.append(f"| {name} | {mode} | failed: {tail[0][:120]} | | | | |")
            else:
                lines.append(_row(name, mode, json.loads(out.stdout.strip().splitlines()[-1])))
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
