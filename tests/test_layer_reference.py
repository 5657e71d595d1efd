"""The per-layer check's reference: float64 for the fp32 class, fp32 (IEEE, native kernels) for a
reduced precision, whose tolerance is 20-100x coarser than fp32's rounding on the longest
reductions (advisor/gate/layer.py, `FP32_REFERENCE_FROM`). The reduced precisions' verdicts must
be those float64 would give, and a wrong kernel must still fail."""

from __future__ import annotations

import torch

from advisor.gate.layer import FP32_REFERENCE_FROM
from advisor.gate.numeric import Gate
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.space import load_space
from advisor.workload.args import make_workload
from advisor.workload.copying import copy_module
from tests.conftest import DATA

CPU = torch.device("cpu")


def _gate_and_convs(settings: Settings):  # noqa: ANN202 - (gate, candidate, its conv inputs)
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    gate = Gate(workload, CPU, "train", load_space("cpu", CPU))
    cand = Candidate(workload, settings, CPU, "train")
    return gate, cand, cand.capture(record_convs=True).convs


def test_a_reduced_precision_is_judged_against_fp32_as_float64_would_judge_it() -> None:
    bf16 = Settings(amp="bf16", memory_format="channels_last")
    gate, cand, convs = _gate_and_convs(bf16)
    tol = gate.space.layer_tolerances.bf16
    assert tol >= FP32_REFERENCE_FROM
    try:
        for c in convs:
            vs_fp32 = gate.layers._layer_errors(cand, c, c.module, torch.float32)
            vs_f64 = gate.layers._layer_errors(cand, c, c.module, torch.float64)
            # output and weight gradient; the input gradient where the layer's input needs one
            assert vs_fp32.keys() == vs_f64.keys() and len(vs_fp32) == 2 + (c.name != "0")
            for what, err in vs_f64.items():
                assert 1e-4 < err < tol  # bf16's own rounding, within its tolerance
                assert abs(vs_fp32[what] - err) < 0.005 * tol, (c.name, what)
        verdict = gate.check_layers(cand, convs)
    finally:
        cand.close()
    assert verdict is not None and verdict.ok
    # the check itself kept fp32 references only (one per layer), and the drawn inputs
    refs = gate.layers._layer_refs
    assert len(refs) == 2 * len(convs)  # the float64 ones computed above, and the fp32 ones
    kept = {key[-1] for key in refs}
    assert kept == {torch.float32, torch.float64}
    assert all(t.dtype == key[-1] for key, ref in refs.items() for t in ref.values())
    assert gate.layers._draws


def test_the_fp32_class_is_judged_against_float64() -> None:
    gate, cand, convs = _gate_and_convs(Settings(memory_format="channels_last"))
    try:
        verdict = gate.check_layers(cand, convs)
    finally:
        cand.close()
    assert verdict is not None and verdict.ok and verdict.tolerance < FP32_REFERENCE_FROM
    assert verdict.error < 1e-5  # fp32 rounding, seen against float64
    refs = list(gate.layers._layer_refs.values())
    assert refs and all(t.dtype == torch.float64 for ref in refs for t in ref.values())


def test_a_wrong_kernel_at_a_reduced_precision_still_fails() -> None:
    # Weights off by 3% in one layer: bf16's rounding is 0.3%, its tolerance 1%.
    gate, cand, convs = _gate_and_convs(Settings(amp="bf16"))
    try:
        c = convs[0]
        wrong = copy_module(c.module)
        with torch.no_grad():
            wrong.weight.mul_(1.03)
        errors = gate.layers._layer_errors(cand, c, wrong, torch.float32)
        right = gate.layers._layer_errors(cand, c, c.module, torch.float32)
    finally:
        cand.close()
    tol = gate.space.layer_tolerances.bf16
    assert errors["output"] > 2 * tol and errors["weight gradient"] < tol
    assert all(err < tol for err in right.values())


def test_the_references_own_arithmetic_is_not_checked_against_float64_and_a_change_is() -> None:
    # PyTorch's default on a CPU computes as the fp32 reference does: checking its layers would
    # judge PyTorch's own fp32 kernels and pay the float64 references for nothing. A change from
    # it (channels_last, an implementation) is checked, and pays them then.
    from advisor.execute.runner import evaluate
    from advisor.measure.stopping import TimingPolicy

    quick = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=3, max_samples=3)
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space("cpu", CPU)
    gate = Gate(workload, CPU, "train", space)
    assert gate.is_reference(Settings()) and gate.is_reference(Settings(cudnn_benchmark=True))
    default = evaluate(workload, Settings(), CPU, "train", space, gate, policy=quick)
    assert default.status == "ok" and default.rel_error == 0.0 and default.layer_error is None
    assert gate.layers._layer_refs == {}
    for change in (Settings(memory_format="channels_last"), Settings(conv_impl="unfold_gemm")):
        assert not gate.is_reference(change)
        r = evaluate(workload, change, CPU, "train", space, gate, policy=quick)
        assert r.status == "ok" and r.layer_error is not None and 0 < r.layer_error < 1e-5, r
    assert len(gate.layers._layer_refs) == 3  # one float64 reference per layer, shared
