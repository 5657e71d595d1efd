"""Does a ranking measured on a busy CPU hold? PyTorch's default against channels_last, in one
process, interleaved and paired by round (`advisor.measure.timing.sample_interleaved`,
`advisor.measure.stats.paired_speedup`), at 2 torch threads and at 1, with the machine as it is
("ambient") and with one busy loop per core started beside it. Other processes' share of the CPU
is measured for every condition (`advisor.measure.machine_load`).

    python benchmarks/contention.py --model benchmarks/models/resnet18.py --mode infer \
        --out benchmarks/results/contention_cpu.md

On a busy CPU each of a step's parallel regions waits for a preempted thread, so a variant with
fewer regions looks faster at 2 threads than it computes: the one-thread figure is the check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(ROOT),) if p not in sys.path]


def run(model: str, mode: str, budget_s: float, reps: int) -> list[dict[str, Any]]:
    import torch

    from advisor.device.allocator import settle_cpu_allocator
    from advisor.knobs import Settings
    from advisor.measure.candidate import Candidate
    from advisor.measure.machine_load import CpuUsage
    from advisor.measure.stats import Measurement, paired_speedup
    from advisor.measure.timing import Sampler, sample_interleaved
    from advisor.workload.args import make_workload

    settle_cpu_allocator()
    workload = make_workload(model_file=model)
    pair = [Settings(), Settings(memory_format="channels_last")]
    cands = [Candidate(workload, s, torch.device("cpu"), mode) for s in pair]  # type: ignore[arg-type]
    threads = torch.get_num_threads()
    rows = []

    def condition(load: str, n: int) -> None:
        torch.set_num_threads(n)
        usage = CpuUsage()
        samples = sample_interleaved([c.step for c in cands], Sampler(torch.device("cpu")),
                                     warmup=2, min_rounds=10, max_rounds=10_000,
                                     budget_s=budget_s)  # fmt: skip
        base, cl = (Measurement(samples_ms=s) for s in samples)
        rows.append({"load": load, "threads": n, "others": usage.others_share(),
                     "default_ms": base.median_ms, "channels_last_ms": cl.median_ms,
                     "speedup": paired_speedup(base, cl), "rounds": len(samples[0])})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)

    for _ in range(reps):
        for n in (threads, 1):
            condition("ambient", n)
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                 for _ in range(os.cpu_count() or 1)]  # fmt: skip
        try:
            for n in (threads, 1):
                condition(f"+{len(loops)} busy loops", n)
        finally:
            for p in loops:
                p.kill()
                p.wait()
    torch.set_num_threads(threads)
    return rows


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln]
        cpu = names[0].split(":", 1)[1].strip() if names else cpu
    lines = [
        "# channels_last against PyTorch's default on a busy CPU",
        "",
        f"Machine: {cpu}, {os.cpu_count()} logical CPUs, "
        f"torch {torch.__version__}; date {datetime.now(timezone.utc).isoformat(timespec='seconds')}.",
        f"Command: `python benchmarks/contention.py --model {args.model} --mode {args.mode}`",
        "",
        "One process, the two built as `advisor.apply` builds them, interleaved and paired by "
        f"round, {args.budget:g} s each per condition. `others`: other processes' share of the "
        "CPU (/proc/stat minus this process and its children; the busy loops are this "
        "script's children, so they are not in it). Speedup: default / channels_last, median of "
        "per-round ratios [95% CI].",
        "",
        "| load | torch threads | others | default ms | channels_last ms | channels_last speedup "
        "| rounds |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        mid, lo, hi = r["speedup"]
        others = "-" if r["others"] is None else f"{r['others']:.0%}"
        lines.append(
            f"| {r['load']} | {r['threads']} | {others} | {r['default_ms']:.1f} "
            f"| {r['channels_last_ms']:.1f} | {mid:.2f}x [{lo:.2f}-{hi:.2f}] | {r['rounds']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(HERE / "models" / "resnet18.py"))
    ap.add_argument("--mode", choices=["infer", "train"], default="infer")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds per variant and condition")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = run(args.model, args.mode, args.budget, args.reps)
    text = render(rows, args)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
