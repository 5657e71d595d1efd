"""Inductor's start runs on the run's device: on a GPU a Triton kernel, not the C++ backend's
instruction-set checks and precompiled header that a CPU function pays (and a GPU graph never
reads). On a GPU, tests/gpu/test_cuda.py checks that no instruction set was picked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from advisor import compiled
from advisor.device import ops
from advisor.execute import runner
from advisor.execute.runner import Gate, evaluate
from advisor.knobs import Settings
from advisor.space import load_space
from advisor.workload.args import make_workload
from tests._cli import python_code, run_env
from tests.standins.cuda_on_cpu import CudaOnCpu

DATA = Path(__file__).parent / "data"


def _recording(seen: list[torch.device]) -> object:
    def placement(device: torch.device) -> torch.device:
        seen.append(device)
        return ops.placement(device)

    return placement


def test_start_compiles_on_the_devices_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.device] = []
    monkeypatch.setattr(compiled, "_STARTED", False)
    monkeypatch.setattr(compiled, "placement", _recording(seen))
    monkeypatch.setattr(ops, "cuda_ops", lambda: CudaOnCpu())
    assert compiled.start_inductor(torch.device("cuda", 0)) > 0
    assert seen == [torch.device("cuda", 0)]
    assert compiled.start_inductor(torch.device("cuda", 0)) == 0.0  # once a process
    assert seen == [torch.device("cuda", 0)]


def test_a_cpu_start_stays_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.device] = []
    monkeypatch.setattr(compiled, "_STARTED", False)
    monkeypatch.setattr(compiled, "placement", _recording(seen))
    assert compiled.start_inductor(torch.device("cpu")) > 0
    assert seen == [torch.device("cpu")]


def test_a_compiled_candidate_starts_inductor_on_its_runs_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker's first compiled candidate pays the start, on the device it measures on.
    asked: list[torch.device | None] = []
    real = compiled.start_inductor

    def start(device: torch.device | None = None) -> float:
        asked.append(device)
        return real(device)

    monkeypatch.setattr(runner, "start_inductor", start)
    workload = make_workload(model_file=str(DATA / "tiny_cnn.py"))
    device = torch.device("cpu")
    space = load_space(str(DATA / "fast_cpu.yaml"), device)
    gate = Gate(workload, device, "infer", space)
    result = evaluate(workload, Settings(compile="default"), device, "infer", space, gate)
    assert result.status == "ok", result.reason
    assert asked == [device]


CHECKS = r"""
import json, threading, time
import torch
from torch._inductor import cpu_vec_isa as vec
from advisor import compiled

spans, real = [], vec.VecISA.check_build

def check_build(self, code):
    t0 = time.perf_counter()
    ok = real(self, code)
    spans.append((str(self), t0, time.perf_counter(), threading.current_thread().name))
    return ok

vec.VecISA.check_build = check_build
with compiled.inductor_caches(compiled.training_cache()):
    compiled._check_instruction_sets()
    before = len(spans)
    valid = [str(i) for i in vec.valid_vec_isa_list()]
print(json.dumps({"spans": spans, "before": before, "valid": valid}))
"""


@pytest.mark.slow
def test_the_instruction_set_checks_run_two_at_a_time_into_inductors_caches(
    tmp_path: Path,
) -> None:
    # A cold cache (a new machine's): each check compiles and loads a test library.
    env = {**run_env(), compiled.CACHE_ENV: str(tmp_path)}
    r = python_code(CHECKS, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    spans = out["spans"]
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT" or not spans:
        pytest.skip("no x86 vector instruction set to check here")
    # Inductor's own list then checks nothing again: it reads what the checks left
    assert len(spans) == out["before"]
    assert set(out["valid"]) == {isa for isa, *_ in spans}
    # each instruction set's checks (one or more builds) from first start to last end
    isas = {isa: (min(s[1] for s in spans if s[0] == isa), max(s[2] for s in spans if s[0] == isa))
            for isa, *_ in spans}  # fmt: skip
    assert "MainThread" not in {s[3] for s in spans}  # in the pool's threads
    if len(isas) >= 2 and (os.cpu_count() or 1) >= 2:  # two sets' checks ran side by side
        first, second = sorted(isas.values())[:2]
        assert second[0] < first[1]
