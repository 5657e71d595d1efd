"""Shape sets: several input shapes or batch sizes, weighted."""

import pytest
import torch

import advisor
from advisor.errors import SpecError
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.measure.stats import Measurement, combine
from advisor.space import load_space
from advisor.workload.build import (
    layer_workload,
    model_workload,
)
from advisor.workload.layer_spec import layer_spec
from advisor.workload.rebuild import workload_from_info
from advisor.workload.shape_sets import with_shape_set

CPU = torch.device("cpu")


def test_batch_size_set_over_a_layer() -> None:
    base = layer_workload(layer_spec("Conv2d(4, 4, 3)", input_shape="1,4,12,12"))
    w = with_shape_set(base, batch_sizes=[1, 2, 4], weights=[1, 1, 2])
    assert [c.inputs[0].shape[0] for c in w.shape_cases] == [1, 2, 4]
    assert [c.weight for c in w.shape_cases] == [1.0, 1.0, 2.0]
    assert w.make_call(CPU, case=2)[0][0].shape == (4, 4, 12, 12)
    again = workload_from_info(w.info)  # what an isolated worker rebuilds
    assert [c.inputs[0].shape for c in again.shape_cases] == [
        c.inputs[0].shape for c in w.shape_cases
    ]


def test_evaluate_weights_per_shape_medians(fast_space: str) -> None:
    base = layer_workload(layer_spec("Conv2d(4, 4, 3)", input_shape="1,4,12,12"))
    w = with_shape_set(base, shapes=[(1, 4, 12, 12), (2, 4, 20, 20)], weights=[3, 1])
    space = load_space(fast_space, CPU)
    gate = Gate(w, CPU, "train", space)
    assert len(gate.cases) == 2
    r = evaluate(w, Settings(), CPU, "train", space, gate)
    assert r.status == "ok" and r.per_shape is not None and len(r.per_shape) == 2
    n = min(len(m.samples_ms) for m in r.per_shape)
    expected = [3 * r.per_shape[0].samples_ms[j] + r.per_shape[1].samples_ms[j] for j in range(n)]
    assert r.measurement.samples_ms == pytest.approx(expected)


def test_combine_single_is_identity() -> None:
    m = Measurement(samples_ms=[1.0, 2.0, 3.0])
    assert combine([m], [1.0]) is m


def test_shape_set_errors() -> None:
    base = layer_workload(layer_spec("Conv2d(4, 4, 3)", input_shape="1,4,12,12"))
    with pytest.raises(SpecError, match="weights for"):
        with_shape_set(base, batch_sizes=[1, 2], weights=[1])
    with pytest.raises(SpecError, match="fails on input shape"):
        with_shape_set(base, shapes=[(1, 4, 12, 12), (1, 5, 12, 12)])
    with pytest.raises(SpecError, match="not both"):
        with_shape_set(base, shapes=[(1, 4, 8, 8)], batch_sizes=[2])


def test_advise_over_a_shape_set(fast_space: str, small_model_file: str) -> None:
    advice = advisor.advise(
        model_file=small_model_file,
        batch_sizes=[1, 3],
        shape_weights=[1, 2],
        device="cpu",
        space=fast_space,
    )
    assert advice.config.workload["shape_set"]["batch_sizes"] == [1, 3]
    assert "over 2 shapes" in advice.config.workload["description"]
    assert all(r.per_shape and len(r.per_shape) == 2 for r in advice.results if r.status == "ok")
    # on a CPU, cudnn.benchmark is never searched: no note about it
    assert advice.config.result.benchmark_note is None


def test_model_workload_rebuilds_from_info(small_model_file: str) -> None:
    w = with_shape_set(model_workload(small_model_file), batch_sizes=[1, 2])
    assert len(workload_from_info(w.info).shape_cases) == 2


def test_benchmark_note_counts_the_per_shape_search() -> None:
    from advisor.measure.results import TrialResult
    from advisor.search.compile_bill import benchmark_note

    off = TrialResult(
        settings=Settings(),
        status="ok",
        measurement=Measurement(samples_ms=[10.0] * 5, first_call_ms=12.0),
    )
    on = TrialResult(
        settings=Settings(cudnn_benchmark=True),
        status="ok",
        measurement=Measurement(samples_ms=[8.0] * 5, first_call_ms=212.0),
    )
    note = benchmark_note([off, on], on)
    assert "saves 2.000 ms per step" in note and "costs 0.2 s" in note and "about 100 steps" in note
    slower = on.model_copy(
        update={"measurement": Measurement(samples_ms=[11.0] * 5, first_call_ms=50.0)}
    )
    assert "does not pay" in benchmark_note([off, slower], off)
    # A twin from another time window (the pick re-timed, its twin from the search) says nothing.
    retimed = slower.model_copy(update={"retimed": True})
    assert benchmark_note([off, retimed], retimed) is None
    assert "does not pay" in benchmark_note(
        [off.model_copy(update={"retimed": True}), retimed], off
    )
