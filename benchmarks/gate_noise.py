"""How noisy is a model-level numerical gate in train mode, and which tolerance rule separates exact
reorderings and bf16 from wrong kernels?

For each model file under benchmarks/models/ (each defines `build_model()` and `example_inputs()`),
in train mode (BatchNorm normalising by batch statistics) and for seeds 0..N-1, this script draws
inputs x ~ N(0, 1) and a fixed output gradient g ~ N(0, 1) / numel(out) (a mean-reduced loss's
scale), runs forward + backward, and compares outputs and all parameter gradients of these
variants with the fp32 reference (contiguous, native conv):

  f64        a float64 copy of the model on x.double()
  pert eps   fp32 on x * (1 + eps * z), z ~ N(0, 1), eps in {1e-7, 1e-6, 1e-5}, K draws each
             (computed in float64, then rounded to fp32)
  CL         channels_last (channels_last_3d for 5-D) fp32, model and input
  bf16       torch.autocast("cpu", dtype=torch.bfloat16), contiguous
  bf16+CL    bf16 autocast and channels_last
  wrong x1.001  fp32, every conv's (and transposed conv's) weight multiplied by 1 + 1e-3
  wrong tap  fp32, the first conv with a 3x3 (3x3x3) kernel gets weight[:, :, 0, 0(, 0)] = 0
  bf16+CL wrong tap / wrong x1.001   the two wrong variants under bf16 autocast + channels_last
             (for rule C, which judges bf16 candidates)

Every variant runs on its own deepcopy of one model that never ran (so BatchNorm running stats are
fresh and the weights identical), and the global RNG is re-seeded before each forward, so a
Dropout draws the same mask in every variant. Errors are ‖a−b‖/‖b‖ in float64 against the fp32
reference; the gradient error is sqrt(Σ‖ga−gb‖² / Σ‖gb‖²) over all parameters.

Then the script counts, per candidate gate rule, the seeds on which it accepts channels_last (and
bf16 + channels_last) and rejects the wrong variants; a candidate passes only when both its
output and its gradient error are within the tolerance, each tolerance computed from the
corresponding (output or gradient) error of the yardstick:

  A  fp32 class: tol = max(1e-4, 3 x (f64 vs fp32 error of that seed))
  B  fp32 class: tol = max(1e-4, F x max over the K perturbed references at eps), F in {2, 4, 8}
  C  bf16 class: tol = max(2e-2, F x (bf16 autocast contiguous error of that seed)), F in {1.5, 2, 4}

Usage (from the repository root):
  python benchmarks/gate_noise.py                       # all four models, 8 seeds
  python benchmarks/gate_noise.py relu_bn_block --seeds 4 --out /tmp/x.md
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import importlib.util
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

HERE = Path(__file__).resolve().parent
MODELS_DIR = HERE / "models"
DEFAULT_MODELS = ["relu_bn_block", "resnet18", "mobilenet_v3_small", "monai_unet3d"]
EPSILONS = (1e-7, 1e-6, 1e-5)
DROPOUT_SEED = 1234  # re-seeded before every forward so dropout masks agree across variants

Result = tuple[Tensor, dict[str, Tensor]]  # output (float64), parameter gradients (float64)


# ----------------------------------------------------------------------------- models and runs


def load_model_file(name: str) -> ModuleType:
    path = MODELS_DIR / f"{name}.py"
    if not path.exists():
        raise SystemExit(f"no model file {path}")
    spec = importlib.util.spec_from_file_location(f"gate_noise_models.{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def conv_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]


def scale_all_convs(model: nn.Module, factor: float = 1 + 1e-3) -> str:
    convs = conv_modules(model)
    with torch.no_grad():
        for m in convs:
            m.weight.mul_(factor)
    return f"{len(convs)} conv weights x {factor}"


def zero_first_tap(model: nn.Module) -> str:
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.conv._ConvNd) and all(k == 3 for k in m.kernel_size):
            nd = len(m.kernel_size)
            with torch.no_grad():
                m.weight[(slice(None), slice(None)) + (0,) * nd] = 0
            return f"{name}.weight[:, :, {', '.join(['0'] * nd)}] = 0"
    raise RuntimeError("model has no conv with a 3x3 kernel")


def run(
    base: nn.Module,
    inputs: tuple[Tensor, ...],
    grad_out: Tensor,
    *,
    double: bool = False,
    channels_last: bool = False,
    bf16: bool = False,
    edit: Callable[[nn.Module], str] | None = None,
) -> Result:
    model = copy.deepcopy(base)
    if edit is not None:
        edit(model)
    if double:
        model = model.double()
        inputs = tuple(x.double() for x in inputs)
    if channels_last:
        inputs = tuple(x.contiguous(memory_format=_cl_format(x)) for x in inputs)
        model = model.to(memory_format=_cl_format(inputs[0]))
    model.train()
    for p in model.parameters():
        p.grad = None
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    torch.manual_seed(DROPOUT_SEED)
    with ctx:
        out = model(*inputs)
    if not isinstance(out, Tensor):
        raise TypeError(f"model returned {type(out).__name__}, expected one tensor")
    out.backward(grad_out.to(out.dtype))
    grads = {
        n: (
            p.grad.detach().double()
            if p.grad is not None
            else torch.zeros(p.shape, dtype=torch.float64)
        )
        for n, p in model.named_parameters()
    }
    return out.detach().double().contiguous(), grads


def _cl_format(x: Tensor) -> torch.memory_format:
    return torch.channels_last_3d if x.dim() == 5 else torch.channels_last


def rel(a: Tensor, b: Tensor) -> float:
    a, b = a.double(), b.double()
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def grad_rel(ga: dict[str, Tensor], gb: dict[str, Tensor]) -> float:
    num = sum(torch.sum((ga[n] - gb[n]) ** 2).item() for n in gb)
    den = sum(torch.sum(gb[n] ** 2).item() for n in gb)
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def errs(res: Result, ref: Result) -> tuple[float, float]:
    return rel(res[0], ref[0]), grad_rel(res[1], ref[1])


# ----------------------------------------------------------------------------- one model


def measure_model(name: str, seeds: int, k: int, log) -> dict:
    mod = load_model_file(name)
    torch.manual_seed(0)
    base = mod.build_model()
    base.train()
    shapes = [tuple(x.shape) for x in mod.example_inputs()]
    edits = {
        "wrong x1.001": scale_all_convs(copy.deepcopy(base)),
        "wrong tap": zero_first_tap(copy.deepcopy(base)),
    }
    n_params = sum(p.numel() for p in base.parameters())
    rows = []
    changed_frac = {eps: [] for eps in EPSILONS}
    t_model = time.perf_counter()
    for seed in range(seeds):
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(seed)
        inputs = tuple(torch.randn(s, generator=gen) for s in shapes)
        out_shape = _output_shape(base, inputs)  # g is drawn before the reference runs
        ggen = torch.Generator().manual_seed(100_000 + seed)
        numel = math.prod(out_shape)
        grad_out = torch.randn(out_shape, generator=ggen) / numel

        ref = run(base, inputs, grad_out)
        row: dict[str, tuple[float, float]] = {}
        row["f64"] = errs(run(base, inputs, grad_out, double=True), ref)
        for eps in EPSILONS:
            outs, grads = [], []
            for j in range(k):
                zgen = torch.Generator().manual_seed(
                    1_000_000 + 1000 * seed + 100 * EPSILONS.index(eps) + j
                )
                pert = []
                for x in inputs:
                    z = torch.randn(x.shape, generator=zgen, dtype=torch.float64)
                    xp = (x.double() * (1 + eps * z)).float()
                    changed_frac[eps].append((xp != x).double().mean().item())
                    pert.append(xp)
                o, g = errs(run(base, tuple(pert), grad_out), ref)
                outs.append(o)
                grads.append(g)
            row[f"pert {eps:.0e} max"] = (max(outs), max(grads))
            row[f"pert {eps:.0e} med"] = (statistics.median(outs), statistics.median(grads))
        row["CL"] = errs(run(base, inputs, grad_out, channels_last=True), ref)
        bf16 = run(base, inputs, grad_out, bf16=True)
        bf16_cl = run(base, inputs, grad_out, bf16=True, channels_last=True)
        row["bf16"] = errs(bf16, ref)
        row["bf16+CL"] = errs(bf16_cl, ref)
        row["bf16+CL vs bf16"] = errs(bf16_cl, bf16)
        row["wrong x1.001"] = errs(run(base, inputs, grad_out, edit=scale_all_convs), ref)
        row["wrong tap"] = errs(run(base, inputs, grad_out, edit=zero_first_tap), ref)
        row["bf16+CL wrong x1.001"] = errs(
            run(base, inputs, grad_out, bf16=True, channels_last=True, edit=scale_all_convs), ref
        )
        row["bf16+CL wrong tap"] = errs(
            run(base, inputs, grad_out, bf16=True, channels_last=True, edit=zero_first_tap), ref
        )
        rows.append(row)
        log(f"  {name} seed {seed}: {time.perf_counter() - t0:.1f} s")
    return {
        "name": name,
        "shapes": shapes,
        "n_params": n_params,
        "edits": edits,
        "rows": rows,
        "changed_frac": {eps: statistics.mean(v) for eps, v in changed_frac.items()},
        "seconds": time.perf_counter() - t_model,
    }


def _output_shape(base: nn.Module, inputs: tuple[Tensor, ...]) -> tuple[int, ...]:
    model = copy.deepcopy(base).train()
    torch.manual_seed(DROPOUT_SEED)
    with torch.no_grad():
        return tuple(model(*inputs).shape)


# ----------------------------------------------------------------------------- rules


def rule_verdict(err: tuple[float, float], tol: tuple[float, float]) -> tuple[bool, bool]:
    """(output within tolerance, gradient within tolerance)."""
    return err[0] <= tol[0], err[1] <= tol[1]


def rules(rows: list[dict], k: int) -> list[dict]:
    """One dict per rule: name, then per judged variant (accepted, out_fail, grad_fail) counts."""
    out = []

    def judge(tol_of: Callable[[dict], tuple[float, float]], variants: list[str]) -> dict:
        res = {}
        for v in variants:
            acc = outf = gradf = 0
            for r in rows:
                ok_o, ok_g = rule_verdict(r[v], tol_of(r))
                acc += ok_o and ok_g
                outf += not ok_o
                gradf += not ok_g
            res[v] = (acc, outf, gradf)
        return res

    fp32_variants = ["CL", "wrong x1.001", "wrong tap"]
    out.append(
        {
            "rule": "A: max(1e-4, 3 x f64 err)",
            "cls": "fp32",
            **judge(
                lambda r: (max(1e-4, 3 * r["f64"][0]), max(1e-4, 3 * r["f64"][1])), fp32_variants
            ),
        }
    )
    for eps in EPSILONS:
        for f in (2, 4, 8):
            key = f"pert {eps:.0e} max"
            out.append(
                {
                    "rule": f"B: max(1e-4, {f} x max_K pert eps={eps:.0e})",
                    "cls": "fp32",
                    **judge(
                        lambda r, f=f, key=key: (
                            max(1e-4, f * r[key][0]),
                            max(1e-4, f * r[key][1]),
                        ),
                        fp32_variants,
                    ),
                }
            )
    bf16_variants = ["bf16+CL", "bf16+CL wrong x1.001", "bf16+CL wrong tap"]
    for f in (1.5, 2, 4):
        out.append(
            {
                "rule": f"C: max(2e-2, {f} x bf16 err)",
                "cls": "bf16",
                **judge(
                    lambda r, f=f: (max(2e-2, f * r["bf16"][0]), max(2e-2, f * r["bf16"][1])),
                    bf16_variants,
                ),
            }
        )
    return out


# ----------------------------------------------------------------------------- report


def fmt(e: tuple[float, float]) -> str:
    return f"{e[0]:.1e} / {e[1]:.1e}"


def summary_rows(rows: list[dict], cols: list[str]) -> list[str]:
    lines = []
    for label, fn in (("min", min), ("median", statistics.median), ("max", max)):
        cells = []
        for c in cols:
            cells.append(fmt((fn([r[c][0] for r in rows]), fn([r[c][1] for r in rows]))))
        lines.append(f"| **{label}** | " + " | ".join(cells) + " |")
    return lines


def table(rows: list[dict], cols: list[str], heads: list[str]) -> list[str]:
    lines = [
        "| seed | " + " | ".join(heads) + " |",
        "| ---: | " + " | ".join("---:" for _ in cols) + " |",
    ]
    for i, r in enumerate(rows):
        lines.append(f"| {i} | " + " | ".join(fmt(r[c]) for c in cols) + " |")
    lines += summary_rows(rows, cols)
    return lines


def report_model(m: dict, k: int) -> list[str]:
    rows = m["rows"]
    n = len(rows)
    lines = [
        f"## {m['name']}",
        "",
        f"Inputs {', '.join('x'.join(map(str, s)) for s in m['shapes'])}; {m['n_params']:,} parameters; "
        f"{n} seeds in {m['seconds']:.0f} s. Wrong variants: x1.001 = {m['edits']['wrong x1.001']}; "
        f"tap = {m['edits']['wrong tap']}. Fraction of input elements that the perturbation actually "
        "changed after rounding to fp32: "
        + ", ".join(f"eps={e:.0e}: {f:.2f}" for e, f in m["changed_frac"].items())
        + ".",
        "",
        "Each cell: output error / global gradient error, relative to the fp32 contiguous reference.",
        "",
    ]
    main_cols = (
        ["f64"]
        + [f"pert {e:.0e} max" for e in EPSILONS]
        + ["CL", "bf16", "bf16+CL", "wrong x1.001", "wrong tap"]
    )
    main_heads = (
        ["f64"]
        + [f"pert {e:.0e} (max of {k})" for e in EPSILONS]
        + ["channels_last", "bf16", "bf16+CL", "wrong x1.001", "wrong tap"]
    )
    lines += table(rows, main_cols, main_heads)
    lines += [
        "",
        f"Perturbed references, median of {k} draws; the wrong variants under bf16 + channels_last; "
        "and bf16+CL measured against bf16 contiguous instead of fp32:",
        "",
    ]
    extra_cols = [f"pert {e:.0e} med" for e in EPSILONS] + [
        "bf16+CL wrong x1.001",
        "bf16+CL wrong tap",
        "bf16+CL vs bf16",
    ]
    extra_heads = [f"pert {e:.0e} (median)" for e in EPSILONS] + [
        "bf16+CL wrong x1.001",
        "bf16+CL wrong tap",
        "bf16+CL vs bf16 (not vs fp32)",
    ]
    lines += table(rows, extra_cols, extra_heads)
    lines += [
        "",
        "Gate rules: seeds accepted (a candidate passes only if output AND gradient are within their "
        "tolerances), with in brackets the seeds whose output / gradient error was over its tolerance. "
        "fp32-class rules judge channels_last (want all accepted) and the two wrong fp32 variants "
        "(want all rejected); rule C judges bf16+CL and the wrong variants under bf16+CL.",
        "",
        "| rule | exact/bf16 candidate accepted | wrong x1.001 rejected | wrong tap rejected | separates all seeds |",
        "| --- | ---: | ---: | ---: | :---: |",
    ]
    for r in rules(rows, k):
        if r["cls"] == "fp32":
            good, w1, w2 = "CL", "wrong x1.001", "wrong tap"
        else:
            good, w1, w2 = "bf16+CL", "bf16+CL wrong x1.001", "bf16+CL wrong tap"
        a, ao, ag = r[good]
        b1 = r[w1]
        b2 = r[w2]
        sep = a == n and b1[0] == 0 and b2[0] == 0
        lines.append(
            f"| {r['rule']} | {good}: {a}/{n} (out {ao}, grad {ag}) "
            f"| {n - b1[0]}/{n} (out {b1[1]}, grad {b1[2]}) "
            f"| {n - b2[0]}/{n} (out {b2[1]}, grad {b2[2]}) | {'yes' if sep else 'no'} |"
        )
    lines.append("")
    return lines


def cross_model_summary(measured: list[dict], k: int) -> list[str]:
    """Per rule and model: does it separate on every seed? 'all': the good candidate accepted and
    both wrong variants rejected; 'tap': the good candidate accepted and the zeroed tap rejected."""
    lines = [
        "## All models: which rules separate on every seed",
        "",
        "all = the exact/bf16 candidate accepted AND both wrong variants rejected on every seed; "
        "tap = the candidate accepted and the zeroed-tap variant rejected on every seed (x1.001 ignored).",
        "",
        "| rule | " + " | ".join(m["name"] for m in measured) + " |",
        "| --- | " + " | ".join(":---:" for _ in measured) + " |",
    ]
    per_model = [rules(m["rows"], k) for m in measured]
    for i, r0 in enumerate(per_model[0] if per_model else []):
        cells = []
        for m, rs in zip(measured, per_model):
            r = rs[i]
            n = len(m["rows"])
            good, w1, w2 = (
                ("CL", "wrong x1.001", "wrong tap")
                if r["cls"] == "fp32"
                else ("bf16+CL", "bf16+CL wrong x1.001", "bf16+CL wrong tap")
            )
            ok_good = r[good][0] == n
            cells.append(
                f"all {'yes' if ok_good and r[w1][0] == 0 and r[w2][0] == 0 else 'no'}, "
                f"tap {'yes' if ok_good and r[w2][0] == 0 else 'no'}"
            )
        lines.append(f"| {r0['rule']} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def machine_header(argv: list[str], seeds: int, k: int) -> list[str]:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import monai  # noqa: F401

        monai_v = monai.__version__
    except Exception:  # noqa: BLE001
        monai_v = "not installed"
    return [
        "# Model-level gate noise: fp32 noise floor, channels_last, bf16 and wrong kernels (train mode)",
        "",
        f"Machine: {cpu} (cpu), torch threads {torch.get_num_threads()}, "
        f"{len(os.sched_getaffinity(0))} CPUs visible; torch {torch.__version__}; "
        f"python {platform.python_version()}; monai {monai_v}; "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}.",
        "",
        f"Command: `{' '.join(['python'] + argv)}` ({seeds} seeds, K={k} perturbations per eps).",
        "",
        "Method: see the docstring of `benchmarks/gate_noise.py`. Train mode; x ~ N(0,1) per seed, output "
        "gradient g ~ N(0,1)/numel(out); each variant on a fresh deepcopy of one never-run model; global RNG "
        "re-seeded before each forward (dropout masks equal). Errors in float64 vs the fp32 contiguous reference.",
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "models",
        nargs="*",
        default=DEFAULT_MODELS,
        help="model file names under benchmarks/models/",
    )
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--k", type=int, default=4, help="perturbed references per eps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--out",
        default=str(HERE / "results" / "gate_noise_cpu.md"),
        help="markdown file to write ('-' for none)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    script = Path(sys.argv[0]).resolve()
    try:
        script_txt = str(script.relative_to(Path.cwd()))
    except ValueError:
        script_txt = str(script)
    lines = machine_header([script_txt] + argv, args.seeds, args.k)
    measured = []
    for name in args.models:
        m = measure_model(name, args.seeds, args.k, log)
        measured.append(m)
        part = report_model(m, args.k)
        print("\n".join(part), flush=True)
        lines += part
    part = cross_model_summary(measured, args.k)
    print("\n".join(part), flush=True)
    lines += part
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
