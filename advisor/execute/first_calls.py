"""The first calls of cudnn.benchmark's twins, taken before anything else runs in their process.

cuDNN searches a convolution's algorithms at the first call of each new (shape, dtype, layout) in
a process, and caches the plan for the rest of it. A twin's first call is the search a training
run pays at its start only where nothing before it in the process ran the same convolutions:
not the gate's references (fp32 with TF32 off, whose plans a `tf32=off` twin would find cached),
not another twin. So the flag's process is told the twins
first (`prime`): it runs each one's first call, in order, each on a freshly built model, and
keeps the times; the twin's trial then reports that first call (`with_first_calls`), and
`compile_bill.paid_by` reads a later twin with the same plan keys as the first one's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from advisor.knobs import Settings
from advisor.measure.candidate import Candidate, Mode
from advisor.measure.results import TrialResult
from advisor.measure.timing import synchronize
from advisor.workload.build import Workload

__all__ = ["prime", "with_first_calls"]


def prime(
    workload: Workload, twins: Sequence[Settings], device: torch.device, mode: Mode, seed: int
) -> dict[str, list[float]]:
    """Each twin's first call (ms) on every shape case, in order, keyed by its settings' JSON."""
    first: dict[str, list[float]] = {}
    for settings in twins:
        times = []
        for case in range(len(workload.shape_cases)):
            cand = Candidate(workload, settings, device, mode, seed, case=case)
            try:
                synchronize(device)
                t0 = time.perf_counter()
                cand.step()
                synchronize(device)
                times.append((time.perf_counter() - t0) * 1e3)
            finally:
                cand.close()
        first[settings.model_dump_json()] = times
    return first


def with_first_calls(result: TrialResult, first_ms: list[float]) -> TrialResult:
    """`result` with its first calls replaced by the primed ones (its own found the plans the
    priming searched)."""
    if result.measurement is None:
        return result
    if result.per_shape is None:
        m = result.measurement.model_copy(update={"first_call_ms": first_ms[0]})
        return result.model_copy(update={"measurement": m})
    per_shape = [m.model_copy(update={"first_call_ms": ms})
                 for m, ms in zip(result.per_shape, first_ms, strict=False)]  # fmt: skip
    total = sum(m.first_call_ms or 0.0 for m in per_shape)
    m = result.measurement.model_copy(update={"first_call_ms": total})
    return result.model_copy(update={"per_shape": per_shape, "measurement": m})
