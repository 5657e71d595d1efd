"""The gate's side of one candidate: its capture as the gate compares it, the verdict from its
errors and its precision's check, and the gate's checks alone for a candidate measured without
them (`gate_only`, asked for where the pick needs its verdict: `advisor.search.pick_gates`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from advisor.compiled import (
    inductor_caches,
    measurement_cache,
    recompile_guard,
    recompile_reason,
    start_inductor,
)
from advisor.device.allocator import keep_cpu_buffers_resident
from advisor.errors import first_line
from advisor.gate.layer import LayerVerdict
from advisor.gate.numeric import Errors, Gate, compare
from advisor.gate.precision import CheckOutOfTime
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate, Captured, Mode
from advisor.measure.results import Failure, Status, TrialResult
from advisor.measure.stop import Stop
from advisor.measure.verdict import PrecisionCheck, round_up
from advisor.workload.build import Workload

__all__ = ["Checked", "capture", "close_candidate", "failed", "gate_only", "verdict",
           "with_precision", "with_verdict"]


def capture(cand: Candidate, compiled: bool, dropout: bool) -> Captured:
    """The candidate's step as the gate compares it. A compiled model: the step as timed, under
    the canonical dropout masks only where the reference drew some; no per-layer record
    (`evaluate`). Its capture under the masks compiles the model again with the gate's dropout
    mode in it: a failure there, after the timed steps ran, is the gate's, and its reason says so
    (`advisor.measure.canonical_dropout`: a graph break in the model, then an in-place
    activation before an in-place dropout)."""
    if not compiled:
        return cand.capture(record_convs=True)
    if not dropout:
        return cand.capture(record_convs=False, canonical=False)
    try:
        return cand.capture(record_convs=False)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with whose failure it is
        raise RuntimeError(
            f"the gate's capture under its dropout masks (the compiled steps ran): {first_line(e)}"
        ) from e


def close_candidate(cand: Candidate) -> str | None:
    """Close a candidate; why that failed, or None."""
    try:
        cand.close()
    except Exception as e:  # noqa: BLE001 - reported as the trial's failure
        return first_line(e)
    return None


# How libraries word an out-of-memory error (not always torch.OutOfMemoryError), and the errors
# after which a CUDA context cannot be trusted: the error's own text is all there is to read.
_OOM = ("out of memory", "can't allocate memory", "CUDA_ERROR_OUT_OF_MEMORY", "OutOfMemoryError")
_DEVICE = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS",
           "cuDNN error", "CUDNN_STATUS")  # fmt: skip


def failed(
    settings: Settings, error: str, precision: str = "fp32", kind: Failure | None = None
) -> TrialResult:
    """A failed result from an error's first line, of the caller's `kind` (a crash, a time
    limit), else one read off the error: out of memory (said so, whatever library raised it),
    or a device error (the worker is replaced)."""
    reason = error
    if any(m in error for m in _DEVICE):
        kind = "device"
    for marker in _OOM:
        at = error.find(marker)
        if at >= 0:
            kind = kind or "oom"
            if at > 0:
                reason = f"out of memory ({error[at:].split('. Error', 1)[0][:160]})"
            break
    return TrialResult(settings=settings, status="failed", reason=reason, failure=kind,
                       precision=precision)  # fmt: skip


@dataclass
class Checked:
    """The gate's checks of one candidate over its shapes so far: its worst output and gradient
    errors against the fp32 reference, its worst conv layer alone against float64, and its
    capture's compile under dropout masks (a compiled candidate's: another graph)."""

    grad_err: float | None  # None in infer mode: no gradients
    err: float = 0.0
    layer: LayerVerdict | None = None
    check_s: float = 0.0
    gate_s: float = 0.0  # in `add`: the captures, comparisons and layer checks

    def add(
        self, cand: Candidate, settings: Settings, gate: Gate, ref: Captured, mode: Mode
    ) -> None:
        """Capture `cand` as the gate compares it and check it against `ref` (one shape's
        reference); raises where the capture fails or the model returns no tensor."""
        t0 = time.perf_counter()
        got = capture(cand, settings.compiled, gate.dropout)
        if settings.compiled and gate.dropout:
            self.check_s += time.perf_counter() - t0
        errors = compare(got, ref, mode)
        self.err = max(self.err, errors.out)
        if self.grad_err is not None:
            self.grad_err = max(self.grad_err, errors.grad or 0.0)
        if not got.outputs:
            raise RuntimeError("the model returned no tensor: nothing to check or time")
        worst = gate.check_layers(cand, got.convs)
        if worst is not None and (self.layer is None or worst.error > self.layer.error):
            self.layer = worst
        self.gate_s += time.perf_counter() - t0


def verdict(
    gate: Gate,
    settings: Settings,
    precision: str,
    checked: Checked,
    check_deadline: float | None,
    **fields: object,
) -> TrialResult:
    """The gate's verdict on a candidate from its checks (outputs and gradients against the fp32
    reference, its worst conv layer alone against float64) and its precision's check, as a
    result with `fields` (its measurement, memory and times), its `gate_s` the checks' and the
    gate's own captures no verdict has counted yet. A candidate with NaN or Inf, or a layer
    over its tolerance, is rejected without the model-level tolerance and the training check.
    Raises `CheckOutOfTime`."""
    err, grad_err, layer = checked.err, checked.grad_err, checked.layer
    status: Status = "ok"
    reason = rejected_by = rejection = tol = None
    finite = math.isfinite(err) and (grad_err is None or math.isfinite(grad_err))
    if not finite or (layer is not None and not math.isfinite(layer.error)):
        status, reason, rejection = "rejected", "NaN or Inf in outputs or gradients", "not_finite"
    elif layer is not None and not layer.ok:
        status, rejected_by = "rejected", f"layer_tolerances.{precision}={round_up(layer.error)}"
        rejection = "tolerance"
        where = f"layer {layer.layer!r}" if layer.layer else "the layer"
        reason = (
            f"{where} alone vs float64: {layer.what} error {layer.error:.2e} over the "
            f"{precision} layer tolerance {layer.tolerance:.1e}"
        )
    else:  # the model-level checks, and the precision's training check, only for the rest
        tol = gate.tolerance(settings, Errors(err, grad_err), check_deadline)
        verdict = tol.judge(Errors(err, grad_err))
        if verdict is not None:
            status = "rejected"
            rejection, reason, rejected_by = verdict
    gate_s, gate.unbilled_s = checked.gate_s + gate.unbilled_s, 0.0
    return TrialResult(
        settings=settings,
        status=status,
        reason=reason,
        rel_error=err,
        grad_error=grad_err,
        grad_tolerance=tol.grad.value if tol is not None and tol.grad else None,
        precision=precision,
        tolerance=tol.out.value if tol is not None else None,
        tolerance_basis=tol.basis if tol is not None else None,
        layer_error=layer.error if layer is not None else None,
        layer_tolerance=layer.tolerance if layer is not None else None,
        layer_detail=f"{layer.layer or 'layer'}: {layer.what}" if layer is not None else None,
        rejected_by=rejected_by,
        rejection=rejection,
        precision_check=tol.out.check if tol is not None else None,
        compile_check_s=checked.check_s or None,
        gate_s=gate_s or None,
        **fields,
    )


def gate_only(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    gate: Gate,
    time_left_s: float | None = None,
) -> TrialResult:
    """The gate's checks of a candidate measured without them (its result `pending`; asked for
    where the pick needs its verdict, `advisor.search.pick_gates`): its capture against the fp32
    reference, and its precision's verdict, on every shape. No samples: the result's verdict
    fields are what the pending result takes (`with_verdict`). A compiled candidate's capture
    compiles in the run's caches (`compile_check_s`)."""
    started = time.perf_counter()
    precision = gate.precision(settings)
    if not settings.compiled:
        result = _gate_only(workload, settings, device, mode, gate, time_left_s)
    else:
        try:
            start_inductor(device)
        except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler: this candidate fails
            return failed(settings, f"torch.compile cannot start: {first_line(e)}", precision)
        # The run's caches, which hold the trial's artifacts: the capture's graph is another
        # (the gate's dropout mode is in it) but most of its kernels are the trial's, so it
        # compiles in about half the time it would take with empty caches.
        with recompile_guard(len(gate.cases)), inductor_caches(measurement_cache()):
            result = _gate_only(workload, settings, device, mode, gate, time_left_s)
    return result.model_copy(update={"wall_s": time.perf_counter() - started})


def _gate_only(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    gate: Gate,
    time_left_s: float | None,
) -> TrialResult:
    check_deadline = None if time_left_s is None else time.perf_counter() + time_left_s
    precision = gate.precision(settings)
    keep_cpu_buffers_resident()
    checked = Checked(0.0 if mode == "train" else None)
    for case in range(len(gate.cases)):  # each reference read after its timing
        cand: Candidate | None = None
        failure = None
        try:
            cand = Candidate(workload, settings, device, mode, gate.seed, case=case)
            checked.add(cand, settings, gate, gate.cases[case], mode)
        except torch.OutOfMemoryError:
            failure = "out of memory"
        except Exception as e:  # noqa: BLE001 - a broken candidate is a result, not a crash
            failure = recompile_reason(e, len(gate.cases)) or first_line(e)
        if cand is not None:
            failure = failure or close_candidate(cand)
        if failure is not None:
            return failed(settings, failure, precision)
    try:
        return verdict(gate, settings, precision, checked, check_deadline)
    except CheckOutOfTime:  # not judged: it is not picked
        return TrialResult(settings=settings, status="stopped", stop=Stop(kind="out_of_time"),
                           precision=precision)  # fmt: skip


# What the verdict of a gate-only evaluation sets on the pending result (its measurement,
# compile times and memory stay the trial's).
_VERDICT_FIELDS = (
    "status", "reason", "rel_error", "grad_error", "tolerance", "grad_tolerance",
    "tolerance_basis", "layer_error", "layer_tolerance", "layer_detail", "rejected_by",
    "precision_check", "compile_check_s", "gate_s", "stop", "failure",
)  # fmt: skip


def with_verdict(pending: TrialResult, verdict: TrialResult) -> TrialResult:
    """A result measured without its gate, with the gate's verdict (`gate_only`): accepted or
    rejected as the gate said; a gate that failed or ran out of time leaves it failed or stopped,
    never picked. Its wall time counts the gate's."""
    update = {k: getattr(verdict, k) for k in _VERDICT_FIELDS}
    update["pending"] = None
    if pending.wall_s is not None and verdict.wall_s is not None:
        update["wall_s"] = pending.wall_s + verdict.wall_s
    if verdict.status == "failed":
        update["reason"] = f"its gate, once it could be picked: {verdict.reason}"
    return pending.model_copy(update=update)


def with_precision(pending: TrialResult, check: PrecisionCheck) -> TrialResult:
    """A result without its gate (measured, or not yet) whose precision another candidate's
    training check has judged (`check`): rejected by that verdict, or waiting for its checks."""
    if check.accepted:
        return TrialResult.model_validate({**pending.model_dump(), "pending": "checks",
                                           "reason": None, "precision_check": check})  # fmt: skip
    rejection, reason, by = check.rejection()
    return pending.model_copy(update={"status": "rejected", "rejection": rejection, "reason": reason,
                                      "rejected_by": by, "precision_check": check,
                                      "pending": None})  # fmt: skip
