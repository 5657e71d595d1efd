"""Writes the walkthrough notebooks and executes them, so they are committed with their outputs
(tables and plots a reader sees on a code host). Edit the cells here, then run:

    python notebooks/build_notebooks.py

CI re-executes every notebook on CPU and compares it with the committed one (tests/test_notebooks.py:
the cells' sources, and each cell's kinds of output and table columns, not the numbers, which
differ run to run), so each uses a small search space with short timing written inside the
notebook, and small sizes unless a GPU is there.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

# Shared first code cell: a quick search space, so a notebook runs in seconds on a CPU.
QUICK_SPACE = '''\
import os
import tempfile
import warnings
from pathlib import Path

import torch
import yaml

import advisor

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, via optuna
warnings.filterwarnings("ignore", message=".*fail_stale_trials is experimental")

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
WORK = Path(tempfile.mkdtemp(prefix="advisor-notebook-"))
os.chdir(WORK)  # every file this notebook writes goes to a temporary folder


def quick_space(name, knobs, per_layer=False):
    """A small search space with short timing, so this notebook runs in seconds.
    For real tuning leave `space=` out: the built-in space for your device is used."""
    data = {
        "schema_version": 1,
        "name": name,
        "device": DEVICE,
        "knobs": knobs,
        "budget": {"trials": 16, "time_s": 60},
        "timing": {"warmup_runs": 1, "warmup_s": 0.0, "min_samples": 5, "max_samples": 30,
                   "target_rel_ci": 0.05, "max_time_s": 0.15},
        "per_layer": per_layer,
    }
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


HALF = "fp16" if GPU else "bf16"  # CPU's half precision is bf16
COLUMNS = ["label", "status", "median_ms", "ci_low_ms", "ci_high_ms", "speedup", "rel_error",
           "reason"]
print("device:", DEVICE)'''


def quickstart() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(
            "# Quickstart: tune one conv layer, read the answer, apply it\n\n"
            "The advisor times combinations of the settings that decide how fast a convolution "
            "runs (memory format, AMP, TF32, cudnn.benchmark, the conv implementation), rejects "
            "those whose numbers drift from an fp32 reference, and writes a config file that one "
            "call applies at training start."
        ),
        new_code_cell(QUICK_SPACE),
        new_markdown_cell(
            "## 1. Tune a layer\n\nWrite the layer as in PyTorch, give its input shape. "
            "`mode='train'` times forward + backward. `storage='memory'` keeps nothing on disk "
            "(the CLI stores studies, so a killed run resumes)."
        ),
        new_code_cell(
            "shape = '32,3,224,224' if GPU else '4,3,64,64'\n"
            "space = quick_space('quickstart', {'memory_format': ['contiguous', 'channels_last'],\n"
            "                                   'amp': ['off', HALF]})\n"
            "advice = advisor.advise(layer='Conv2d(3, 16, 3, padding=1)', input_shape=shape,\n"
            "                        mode='train', device=DEVICE, space=space, storage='memory')\n"
            "advice"
        ),
        new_markdown_cell(
            "## 2. Read the table\n\n`advice.trials` is a DataFrame with every candidate: "
            "median and 95% CI of the step time, speedup vs PyTorch's default, error vs the fp32 "
            "reference, and for rejected or failed candidates the reason."
        ),
        new_code_cell("advice.trials[COLUMNS]"),
        new_markdown_cell(
            "The same summary the CLI prints: baseline vs recommended with the speedup's "
            "interval, what each single change gives alone, and the rejected candidates."
        ),
        new_code_cell(
            "from rich.console import Console\n\n"
            "from advisor.report.progress import summary_tables\n\n"
            "console = Console(width=120)\n"
            "for table in summary_tables(advice):\n"
            "    console.print(table)\n"
            "print('Why:', advice.config.result.why)"
        ),
        new_markdown_cell(
            "## 3. Save the config\n\nJSON, validated on load; `settings` may be edited by hand."
        ),
        new_code_cell(
            "from advisor.report.describe import describe_config\n\n"
            "path = advice.save('tuned.json')\n"
            "print(describe_config(str(path)))"
        ),
        new_markdown_cell(
            "## 4. Apply it at training start\n\n`advisor.apply` sets the flags, converts the "
            "model's memory format and swaps conv layers; it imports neither optuna nor pandas. "
            "The training step is the usual one, inside `tuned.autocast()`."
        ),
        new_code_cell(
            "from torch import nn\n\n"
            "torch.manual_seed(0)\n"
            "model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),\n"
            "                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))\n"
            "tuned = advisor.apply(path, model, device=DEVICE)\n"
            "opt = torch.optim.SGD(tuned.model.parameters(), lr=0.1)\n"
            "loss_fn = nn.CrossEntropyLoss()\n"
            "x = torch.randn(*map(int, shape.split(',')))\n"
            "y = torch.randint(0, 10, (x.shape[0],), device=DEVICE)\n"
            "for step in range(3):\n"
            "    (xb,) = tuned.inputs(x)\n"
            "    opt.zero_grad(set_to_none=True)\n"
            "    with tuned.autocast():\n"
            "        loss = loss_fn(tuned.model(xb), y)\n"
            "    if tuned.scaler:\n"
            "        tuned.scaler.scale(loss).backward()\n"
            "        tuned.scaler.step(opt)\n"
            "        tuned.scaler.update()\n"
            "    else:\n"
            "        loss.backward()\n"
            "        opt.step()\n"
            "    print(f'step {step}: loss {loss.item():.4f}')\n"
            "tuned.restore()  # puts PyTorch's global flags back (optional at the end of a run)"
        ),
    ]
    return _notebook(cells)


MODEL_FILE = """\
# A small conv net: what `advisor advise net.py --mode train` reads.
import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16),    # depthwise
        nn.Conv2d(16, 32, 1), nn.ReLU(),               # pointwise
        nn.ConvTranspose2d(32, 8, 2, stride=2),         # upsampling
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(4, 3, 32, 32),)
"""


def whole_model() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(
            "# A whole model in train mode: global knobs, per-layer implementations, the report\n\n"
            "A model file defines `build_model()` and `example_inputs()`. The advisor first "
            "searches the global knobs, then times each conv layer alone with every "
            "implementation that qualifies for it and keeps a per-layer choice only when the "
            "whole model gets faster beyond noise."
        ),
        new_code_cell(QUICK_SPACE),
        new_code_cell(
            f'MODEL_FILE = """\\\n{MODEL_FILE}"""\n'
            "net = Path('net.py')\n"
            "net.write_text(MODEL_FILE)\n"
            "print(MODEL_FILE)"
        ),
        new_markdown_cell(
            "Studies go to a storage (here a journal file in a temporary folder; the CLI's "
            "default is a SQLite file in `~/.cache/conv-advisor`), so the report can read every "
            "trial back later."
        ),
        new_code_cell(
            "storage = 'studies.journal'\n"
            "space = quick_space('whole_model', {\n"
            "    'memory_format': ['contiguous', 'channels_last'],\n"
            "    'amp': ['off', HALF],\n"
            "    'conv_impl': ['native', 'unfold_gemm', 'transpose_as_mul'],\n"
            "}, per_layer=True)\n"
            "advice = advisor.advise(model_file=str(net), mode='train', device=DEVICE,\n"
            "                        space=space, storage=storage)\n"
            "advice.trials[COLUMNS]"
        ),
        new_markdown_cell(
            "## Per-layer choices\n\n`settings.layers` maps module names to implementations, "
            "for layers whose choice differs from `conv_impl`. It is often empty on a CPU: "
            "the native oneDNN kernels are hard to beat there."
        ),
        new_code_cell(
            "print('global:', advice.settings.label())\n"
            "print('per-layer:', advice.settings.layers or 'none (every layer keeps '\n"
            "      f'{advice.settings.conv_impl})')\n"
            "print('why:', advice.config.result.why)"
        ),
        new_markdown_cell(
            "## The report\n\nOne self-contained HTML file (opens offline) with the plots, the "
            "rejected candidates and why, and the environment; the plots are also written as "
            "PNGs next to it. Same as `advisor report tuned.json --storage ... --out report.html`."
        ),
        new_code_cell(
            "from IPython.display import Image, display\n\n"
            "from advisor.report.write import png_dir, write_report\n\n"
            "config = advice.save('tuned.json')\n"
            "report = write_report(str(config), Path('report.html'), storage)\n"
            "pngs = sorted(png_dir(report).glob('*.png'))\n"
            "print(report, f'{report.stat().st_size / 1e6:.1f} MB; plots:', *(p.name for p in pngs))\n"
            "display(*(Image(filename=str(p)) for p in pngs))"
        ),
    ]
    return _notebook(cells)


def seeds() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(
            "# Three slow conv cases, measured with the advisor\n\n"
            "Three claims about where PyTorch's default convolution is slow, each measured "
            "honestly (synchronised, warmed up, repeated) instead of with a bare `time.time()`. On "
            "a CPU the sizes are small so this runs in CI; with a GPU the notebook uses the sizes "
            "of the claims (`python -m benchmarks advise --set seeds` runs the same cases, "
            "`seed_*`). The numbers are whatever this machine measures: no result is assumed."
        ),
        new_code_cell(QUICK_SPACE),
        new_markdown_cell(
            "## 1. Conv3d with a (1,3,3) kernel vs Conv2d over folded time (backward)\n\n"
            "The claim: Conv3d's backward is 2-3x slower than the same work as Conv2d over "
            "`B*T` images. The `fold_time` implementation is that rewrite, exact, so the advisor "
            "can measure both and pick."
        ),
        new_code_cell(
            "shape = '8,2,500,64,64' if GPU else '2,2,16,32,32'\n"
            "advice = advisor.advise(\n"
            "    layer='Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False)', input_shape=shape,\n"
            "    mode='train', device=DEVICE, storage='memory',\n"
            "    space=quick_space('fold_time', {'conv_impl': ['native', 'fold_time']}))\n"
            "advice.trials[COLUMNS]"
        ),
        new_markdown_cell(
            "## 2. Depthwise ConvTranspose2d, kernel 2 stride 2, under AMP: a batch sweep\n\n"
            "The claim: this layer becomes 25x slower at a larger batch under AMP, and "
            "channels_last fixes it. Sweep the batch and let the advisor search memory format, AMP and the "
            "`transpose_as_mul` rewrite (stride == kernel: no overlap, a broadcast multiply)."
        ),
        new_code_cell(
            "import pandas as pd\n\n"
            "channels, size = (2048, 16) if GPU else (64, 8)\n"
            "batches = [8, 16, 32, 64] if GPU else [2, 8]\n"
            "space = quick_space('deconv', {'memory_format': ['contiguous', 'channels_last'],\n"
            "                               'amp': ['off', HALF],\n"
            "                               'conv_impl': ['native', 'transpose_as_mul']})\n"
            "rows = []\n"
            "for batch in batches:\n"
            "    a = advisor.advise(\n"
            "        layer=f'ConvTranspose2d({channels}, {channels}, 2, stride=2, groups={channels},'\n"
            "              ' bias=False)',\n"
            "        input_shape=f'{batch},{channels},{size},{size}', mode='infer', device=DEVICE,\n"
            "        space=space, storage='memory')\n"
            "    t = a.trials.set_index('label')\n"
            "    amp_only = f'amp={HALF}'\n"
            "    rows.append({\n"
            "        'batch': batch,\n"
            "        'default ms': t.loc['default', 'median_ms'],\n"
            "        'amp alone ms': t.loc[amp_only, 'median_ms'] if amp_only in t.index else None,\n"
            "        'recommended': a.settings.label(),\n"
            "        'recommended ms': a.config.result.tuned.median_ms,\n"
            "        'speedup': round(a.speedup, 2),\n"
            "    })\n"
            "pd.DataFrame(rows)"
        ),
        new_markdown_cell(
            "## 3. unfold + GEMM vs the default conv on a 3→16 conv\n\n"
            "The claim: unfolding patches and doing one matrix multiply beats the default "
            "convolution. `unfold_gemm` is that implementation; the advisor times both "
            "and checks that unfold+GEMM gives the same numbers."
        ),
        new_code_cell(
            "shape = '32,3,224,224' if GPU else '4,3,64,64'\n"
            "advice = advisor.advise(\n"
            "    layer='Conv2d(3, 16, 3, padding=1)', input_shape=shape, mode='train',\n"
            "    device=DEVICE, storage='memory',\n"
            "    space=quick_space('unfold', {'conv_impl': ['native', 'unfold_gemm']}))\n"
            "print('recommended:', advice.settings.label(), '-', advice.config.result.why)\n"
            "advice.trials[COLUMNS]"
        ),
    ]
    return _notebook(cells)


def _notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"  # stable ids: rebuilding does not churn the files
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    return nb


NOTEBOOKS = {"quickstart.ipynb": quickstart, "whole_model.ipynb": whole_model, "seeds.ipynb": seeds}


def built(name: str, folder: Path) -> nbformat.NotebookNode:
    """Notebook `name` as this file builds it, without outputs, written in `folder` and formatted
    as the project's formatter writes code (so the sources are what gets committed)."""
    nb = NOTEBOOKS[name]()
    nbformat.validate(nb)
    path = folder / name
    nbformat.write(nb, path)
    subprocess.run([sys.executable, "-m", "ruff", "format", "-q", str(path)], check=True)
    return nbformat.read(path, as_version=4)


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel, top to bottom (raises on the first cell that fails)."""
    import nbclient

    with tempfile.TemporaryDirectory() as cwd:
        client = nbclient.NotebookClient(
            nb,
            timeout=300,
            kernel_name="python3",
            record_timing=False,  # no timestamps: a rebuilt notebook differs only where it must
            resources={"metadata": {"path": cwd}},
        )
        client.execute()
    for cell in nb.cells:  # one block per run of prints, as a reader expects (the kernel splits)
        if cell.cell_type == "code":
            cell.outputs = _coalesced(cell.outputs)
    return nb


def _coalesced(outputs: list[Any]) -> list[Any]:
    merged: list[Any] = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (
            out.output_type == "stream"
            and prev is not None
            and prev.output_type == "stream"
            and prev.name == out.name
        ):
            prev.text += out.text
        else:
            merged.append(out)
    return merged


def signature(nb: nbformat.NotebookNode) -> list[tuple[Any, ...]]:
    """What a re-run must reproduce, and not the numbers (timings differ run to run): each cell's
    type and source, and for code cells the kinds of output in order (stdout, a result or display
    and its MIME types, a table's column headers, an error) with repeats of a kind collapsed (how
    many plots or tables a search yields may vary). stderr is left out: warnings vary by machine."""
    cells = []
    for cell in nb.cells:
        kinds: list[tuple[Any, ...]] = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                if out.name == "stderr":
                    continue
                kind: tuple[Any, ...] = ("stream", out.name)
            elif out.output_type == "error":
                kind = ("error", out.ename)
            else:
                data = out.get("data", {})
                kind = (out.output_type, tuple(sorted(data)), _headers(data.get("text/html", "")))
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
        cells.append((cell.cell_type, cell.source, tuple(kinds)))
    return cells


def _headers(html: str) -> tuple[str, ...]:
    """The column headers of an HTML table (a DataFrame's), or () for other HTML."""
    head = re.search(r"<thead>(.*?)</thead>", html, re.S)
    return tuple(re.findall(r"<th[^>]*>(.*?)</th>", head.group(1), re.S)) if head else ()


def main() -> None:
    for name in NOTEBOOKS:
        with tempfile.TemporaryDirectory() as tmp:
            nb = execute(built(name, Path(tmp)))
        nbformat.write(nb, HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
