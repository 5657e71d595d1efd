"""A cudnn.benchmark twin's first call is the search a fresh process pays: nothing runs the same
convolutions before it in the flag's process (advisor/execute/first_calls.py).

On an H200 the gate's fp32 references, computed when the flag's worker started, searched the
plans of `tf32=off` (contiguous, fp32, TF32 off): that twin's first call then took 9 ms, against
0.55 s in a fresh process. Through the CUDA stand-in (tests/standins/cuda_on_cpu.py), the model
below stands in for cuDNN's plan cache as the stand-in does for the CUDA runtime: with
cudnn.benchmark on, the first forward of each (layout, TF32, autocast) key in a process waits
SEARCH_S, as a search would; later ones do not. The tests check which first call is read, not
speed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advisor.execute.make_evaluator import new_evaluator
from advisor.knobs import Settings
from advisor.space import load_space
from advisor.workload.args import make_workload
from tests.conftest import DATA

SPACE = str(DATA / "cuda_quick.yaml")
SEARCH_S = 0.4
PLAN_NET = f"""import time, torch
from torch import nn
SEEN = set()
class Net(nn.Sequential):
    def forward(self, x):
        if torch.backends.cudnn.benchmark and x.shape[0] != 1:
            key = (x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(),
                   torch.backends.cudnn.allow_tf32, torch.is_autocast_enabled(x.device.type))
            if key not in SEEN:
                SEEN.add(key)
                time.sleep({SEARCH_S})
        return super().forward(x)
def build_model():
    torch.manual_seed(0)
    return Net(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3))
def example_inputs():
    return (torch.randn(2, 3, 12, 12),)
"""
# The references' own key (contiguous, fp32, TF32 off), and another
REF_KEY = Settings(tf32="off", cudnn_benchmark=True)
OTHER = Settings(memory_format="channels_last", cudnn_benchmark=True)


def _split(tmp_path: Path):  # type: ignore[no-untyped-def]
    net = tmp_path / "plan_net.py"
    net.write_text(PLAN_NET)
    cuda = torch.device("cuda")
    return new_evaluator(make_workload(model_file=str(net)), cuda, load_space(SPACE, cuda),
                         "train", isolate=True, timeout_s=120)  # fmt: skip


@pytest.mark.slow  # two worker processes through the stand-in (about 10 s)
@pytest.mark.usefixtures("cuda_standin")
def test_primed_twins_each_report_their_own_fresh_search(tmp_path: Path) -> None:
    ev = _split(tmp_path)
    try:
        assert ev.prime([OTHER, REF_KEY]) is None
        first, second = ev(OTHER), ev(REF_KEY)  # the second after the first's gate
    finally:
        ev.close()
    for r in (first, second):
        assert r.status == "ok" and r.measurement is not None, r.reason
        assert r.measurement.first_call_ms is not None
        assert r.measurement.first_call_ms >= SEARCH_S * 1e3, r.settings.label()


@pytest.mark.slow
@pytest.mark.usefixtures("cuda_standin")
def test_the_gate_s_references_do_not_search_before_the_first_twin(tmp_path: Path) -> None:
    ev = _split(tmp_path)
    try:
        r = ev(REF_KEY)  # no priming: the worker's start computed no reference
    finally:
        ev.close()
    assert r.status == "ok" and r.measurement is not None, r.reason
    assert (r.measurement.first_call_ms or 0.0) >= SEARCH_S * 1e3


@pytest.mark.slow
@pytest.mark.usefixtures("cuda_standin")
def test_the_flag_s_process_starts_loading_before_its_first_task(tmp_path: Path) -> None:
    from advisor.execute.isolate import IsolatedEvaluator

    ev = _split(tmp_path)
    try:
        ev.launch_on()  # as the run does before its search
        on = ev._on
        assert isinstance(on, IsolatedEvaluator)
        assert on._proc is not None and on._proc.is_alive()  # loading, not waited for
        assert ev.prime([REF_KEY]) is None  # its first task waits for it, then runs
        r = ev(REF_KEY)
    finally:
        ev.close()
    assert r.status == "ok" and (r.measurement.first_call_ms or 0.0) >= SEARCH_S * 1e3  # type: ignore[union-attr]


def test_primed_first_calls_replace_each_shape_s_and_their_sum() -> None:
    from advisor.execute.first_calls import with_first_calls
    from advisor.measure.results import TrialResult
    from advisor.measure.stats import Measurement

    per = [Measurement(samples_ms=[2.0] * 5, first_call_ms=3.0),
           Measurement(samples_ms=[4.0] * 5, first_call_ms=5.0)]  # fmt: skip
    r = TrialResult(settings=OTHER, status="ok", per_shape=per,
                    measurement=Measurement(samples_ms=[3.0] * 5, first_call_ms=8.0))  # fmt: skip
    got = with_first_calls(r, [400.0, 600.0])
    assert [m.first_call_ms for m in got.per_shape or []] == [400.0, 600.0]
    assert got.measurement is not None and got.measurement.first_call_ms == 1000.0
    one = TrialResult(settings=OTHER, status="ok", measurement=per[0])
    assert with_first_calls(one, [420.0]).measurement.first_call_ms == 420.0  # type: ignore[union-attr]
    failed = TrialResult(settings=OTHER, status="failed", reason="x")
    assert with_first_calls(failed, [1.0]) == failed  # nothing measured: nothing to replace


def test_references_are_taken_at_once_except_in_the_flag_s_process() -> None:
    from advisor.gate.numeric import Gate

    cpu = torch.device("cpu")
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    space = load_space(str(DATA / "fast_cpu.yaml"), cpu)
    # PyTorch's default's process: at once, with no candidate alive beside them
    assert len(Gate(workload, cpu, "train", space).cases._got) == len(workload.shape_cases)
    flag = Gate(workload, cpu, "train", space, cudnn_benchmark=True)
    assert flag.cases._got == {} and len(flag.cases) == len(workload.shape_cases)  # not yet
    assert flag.cases[0].outputs and set(flag.cases._got) == {0}  # taken when first read
