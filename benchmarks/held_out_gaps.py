"""A precision's gap to fp32 in the training check's task, on the batches it trained on and on
held-out batches of the same task (advisor/gate/held_out.py), at several horizons: where a
precision trails only near the floor of memorising the check's batches, the two disagree.

Each row: fp32 and the precision trained from the same weights at one learning rate (Adam, the
check's task and batches), and fp32 on the band's other batches; every trained model evaluated in
fp32 on its own training batches and on the held-out batches, each over its start. Verdicts, not
timing: any machine load is fine.

    python benchmarks/held_out_gaps.py MODEL_FILE [--lr 1e-4] [--steps 16,32] [--seeds 1]
        [--amp bf16] [--out FILE]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.gate import training  # noqa: E402
from advisor.gate.reference_runs import fp32_runs  # noqa: E402
from advisor.knobs import Settings  # noqa: E402
from advisor.measure.verdict import PrecisionCheckSettings  # noqa: E402
from advisor.workload.build import model_workload  # noqa: E402

CPU = torch.device("cpu")


def _task(workload, cfg: PrecisionCheckSettings, first_seed: int, seed: int):  # noqa: ANN001, ANN202
    batches = training.batches_of(workload, cfg.batches, first_seed + 100 * seed)
    targets = training.targets_of(workload, batches, CPU, "train", cfg, seed)
    return batches, targets, training.start_loss(workload, CPU, batches, targets)


def _row(workload, amp: str, cfg: PrecisionCheckSettings, seed: int) -> str:  # noqa: ANN001
    t0 = time.perf_counter()
    task, held, other = (_task(workload, cfg, s, seed) for s in (1000, 9000, 5000))

    def run(settings: Settings, on: tuple) -> tuple[float, float]:
        kept: list[training.Weights] = []
        losses = training.train(workload, settings, CPU, on[0], on[1], cfg, keep=kept)
        ho = training.judged_weights(workload, kept[0], CPU, held[0], held[1]) / held[2]
        return losses[-1] / on[2], ho

    f_own, f_ho = run(training.REFERENCE, task)
    p_own, p_ho = run(Settings(amp=amp), task)
    o_own, o_ho = run(training.REFERENCE, other)
    cells = [seed, cfg.lr, cfg.steps, f"{f_own:.4f}", f"{p_own:.4f}", f"{p_own - f_own:+.2%}",
             f"{abs(o_own - f_own):.2%}", f"{1 - f_ho:.1%}", f"{p_ho - f_ho:+.2%}",
             f"{abs(o_ho - f_ho):.2%}", f"{time.perf_counter() - t0:.0f}"]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--lr", type=float, help="Adam's rate (default: the one the check keeps)")
    p.add_argument("--steps", default="16,32")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--amp", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--out")
    args = p.parse_args(argv)
    workload = model_workload(args.model)
    lines = [
        f"# Training-batch and held-out gaps: {Path(args.model).name}, {args.amp}",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        f"threads, torch {torch.__version__}. Command: `python benchmarks/held_out_gaps.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        "Losses over each set's start. Train: the check's batches (fp32's end, the precision's, "
        "its gap, fp32's band on other batches). Held-out: fp32's drop there, the precision's gap, "
        "and fp32 trained on the other batches from fp32 (the held-out band).",
        "",
        "| seed | lr | steps | fp32 end | precision end | train gap | train band | held-out "
        "learnt | held-out gap | held-out band | s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for seed in range(args.seeds):
        base = PrecisionCheckSettings()
        lr = args.lr or fp32_runs(workload, CPU, "train", base, seed, band=False).cfg.lr
        for steps in (int(s) for s in args.steps.split(",")):
            row = _row(workload, args.amp, base.model_copy(update={"lr": lr, "steps": steps}), seed)
            lines.append(row)
            print(row, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
