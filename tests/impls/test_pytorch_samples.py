"""PyTorch's own conv samples through every implementation, against PyTorch in float64.

The samples (tests/impls/pytorch_samples.py) are the OpInfos of nn.functional.conv*d and
conv_transpose*d and the ModuleInfos of nn.Conv*, nn.ConvTranspose* and their Lazy variants from
`torch.testing._internal`, each also called in the forms a layer meets (issue 31): strided
(PyTorch's own `noncontiguous_like`, NaN in the gaps), channels-last, a zero batch, output_size=
(a list and a full torch.Size) for transposed convs, and the 'reflect', 'replicate' and
'circular' padding modes for padded convs; and, derived, each transposed one with stride ==
kernel (the layer transpose_as_mul takes, which none of PyTorch's samples is).

Every implementation that qualifies (`why_not` is None) runs each sample swapped in, forward and
backward: in float64 where it computes float64 (relative error < 1e-10), else in float32 against
the float64 reference (< 1e-5). It must never raise where PyTorch's module does not; calls it
leaves to PyTorch (`fallbacks`) pass through PyTorch's op and are counted apart. Triton runs
through its interpreter on a subset (see TRITON_EVERY; `--triton-all` runs them all).

    python -m tests.impls.test_pytorch_samples     # the per-implementation table
    pytest -s tests/impls/test_pytorch_samples.py  # the same table, after the tests
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from advisor import impls
from tests.impls.pytorch_samples import CPU, Sample, load_databases, module_from_functional, samples
from tests.impls.swap_check import compare

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
# The interpreter runs each Triton program in Python (0.1-30 s a sample): the suite takes every
# TRITON_EVERY-th of the samples cheapest to interpret (kernel positions x elements <= TRITON_COST)
TRITON_EVERY = 3
TRITON_COST = 1000
MIN_SAMPLES = 300
BUILT_IN = ("native", "unfold_gemm", "triton", "fold_time", "transpose_as_mul")


@dataclass
class Row:
    samples: int = 0
    qualified: int = 0
    passed: int = 0
    fell_back: int = 0  # of passed: PyTorch's op computed the call
    pytorch_raised: int = 0  # qualified samples PyTorch's module itself refuses
    worst: float = 0.0
    failures: list[str] = field(default_factory=list)


REPORT: dict[str, Row] = {}


# ---- running them -------------------------------------------------------------------------------


def _run_dtype(impl: str, module: nn.Module) -> torch.dtype | None:
    """float64 where the implementation computes it, else float32, else None (not qualified)."""
    for dtype in (torch.float64, torch.float32):
        if impls.why_not(impl, module, device=CPU, dtype=dtype) is None:
            return dtype
    return None


def run_impl(impl: str, todo: list[Sample]) -> Row:
    row = Row(samples=len(todo))
    for sample in todo:
        module = sample.build()
        dtype = _run_dtype(impl, module)
        if dtype is None:
            continue
        row.qualified += 1
        try:
            outcome = compare(module.to(dtype), impl, sample.input(dtype), sample.kwargs)
        except Exception as exc:  # recorded, and failed below with every other failure
            row.failures.append(f"{sample.name}: raised {type(exc).__name__}: {exc}")
            continue
        if outcome.pytorch_raised is not None:
            row.pytorch_raised += 1
            continue
        row.worst = max(row.worst, outcome.worst)
        if outcome.worst >= TOL[dtype]:
            row.failures.append(f"{sample.name} ({dtype}): relative errors {outcome.errors}")
            continue
        row.passed += 1
        row.fell_back += outcome.fallbacks > 0
    return row


def _interpreter_cost(sample: Sample) -> int:
    """Kernel positions x (input + output elements): roughly the interpreter's work."""
    module = sample.build()
    with torch.no_grad():
        out = module(sample.x, **sample.kwargs)
    return math.prod(module.kernel_size) * (sample.x.numel() + out.numel())  # type: ignore[arg-type]


def impl_samples(impl: str, every: list[Sample], triton_all: bool = False) -> list[Sample]:
    if impl != "triton" or triton_all:
        return every
    return [s for s in every if _interpreter_cost(s) <= TRITON_COST][::TRITON_EVERY]


def table(report: dict[str, Row], drawn: list[Sample]) -> str:
    as_drawn = sum("/" not in s.name for s in drawn)
    lines = [f"{as_drawn} samples drawn from torch.testing._internal, {len(drawn)} with variants"]
    head = f"{'implementation':<18}{'samples':>8}{'qualified':>10}{'passed':>8}{'fell back':>10}"
    lines.append(head + f"{'torch raised':>13}{'worst rel err':>15}")
    for impl, r in report.items():
        lines.append(
            f"{impl:<18}{r.samples:>8}{r.qualified:>10}{r.passed:>8}{r.fell_back:>10}"
            f"{r.pytorch_raised:>13}{r.worst:>15.1e}"
        )
    return "\n".join(lines)


# ---- the tests ----------------------------------------------------------------------------------


def _samples_or_skip() -> list[Sample]:
    drawn = samples()
    if isinstance(drawn, str):
        pytest.skip(drawn)
    return drawn


@pytest.fixture(scope="module", autouse=True)
def _print_table() -> Iterator[None]:
    yield
    if REPORT:
        drawn = samples()
        assert not isinstance(drawn, str)
        print(f"\nPyTorch's conv samples per implementation (CPU):\n{table(REPORT, drawn)}")


def test_enough_samples() -> None:
    drawn = _samples_or_skip()
    assert len(drawn) >= MIN_SAMPLES, len(drawn)


def test_loading_leaves_the_process_as_it_was() -> None:
    """torch.testing._internal freezes torch.backends flags and loads its hypothesis profile on
    import: undone, or every later test that applies settings or draws examples would change."""
    import hypothesis

    profile = hypothesis.settings.get_current_profile_name()
    _samples_or_skip()
    assert not torch.backends.flags_frozen()
    torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark  # allowed again
    assert hypothesis.settings.get_current_profile_name() == profile


def test_functional_samples_become_their_module() -> None:
    """A functional sample's module computes what the functional op computes on it."""
    dbs = load_databases()
    if isinstance(dbs, str):
        pytest.skip(dbs)
    for op in dbs[0]:
        if op.name.startswith("nn.functional.conv"):
            for s in op.sample_inputs(CPU, torch.float64):
                module = module_from_functional(op.name, s)()
                torch.testing.assert_close(module(s.input), op(s.input, *s.args, **s.kwargs))


# triton runs in its interpreter on a CPU (9 s)
@pytest.mark.parametrize(
    "impl", [pytest.param(i, marks=pytest.mark.slow) if i == "triton" else i for i in impls.names()]
)
def test_samples_through(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton on CPU tensors
    drawn = _samples_or_skip()
    row = run_impl(impl, impl_samples(impl, drawn))
    REPORT[impl] = row
    assert not row.failures, f"{len(row.failures)} failures:\n" + "\n".join(row.failures[:20])
    if impl in BUILT_IN:  # each takes some (transpose_as_mul only the derived stride=kernel)
        assert row.passed > 0, row
    assert row.passed + row.pytorch_raised == row.qualified


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--triton-all", action="store_true", help="every sample through triton (~15 min on CPU)"
    )
    args = parser.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_num_threads(1)  # see tests/impls/conftest.py one_thread
    drawn = samples()
    if isinstance(drawn, str):
        raise SystemExit(f"no samples: {drawn}")
    report = {
        impl: run_impl(impl, impl_samples(impl, drawn, args.triton_all)) for impl in impls.names()
    }
    print(table(report, drawn))
    for impl, row in report.items():
        for failure in row.failures:
            print(f"FAIL {impl}: {failure}")


if __name__ == "__main__":
    main()
