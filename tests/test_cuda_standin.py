"""The advisor's CUDA branches, driven on a CPU through a stand-in for the CUDA calls
(tests/standins/cuda_on_cpu.py). These tests prove control flow, not speed: every timing here is
the host clock of a CPU pretending to be a GPU, and nothing in them says how fast anything is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from advisor.config import load_config
from advisor.device.environment import resolve_device
from advisor.device.ops import CudaOps, cuda_ops
from tests._cli import advisor_cli
from tests.conftest import DATA

SPACE = str(DATA / "cuda_quick.yaml")


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_worker_makes_an_index_less_cuda_device_current(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real CudaOps over the real torch.cuda.set_device: only the C call at its end is
    # replaced (this torch has no CUDA). A bare "cuda" (what --device cuda and auto give) was
    # passed to set_device as it was, which raises before any CUDA call.
    calls: list[int] = []
    monkeypatch.setattr(torch._C, "_cuda_setDevice", calls.append, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    ops = CudaOps()
    with pytest.raises(ValueError, match="specified index"):
        ops.set_device(torch.device("cuda"))
    ops.make_current(torch.device("cuda"))
    ops.make_current(torch.device("cuda:0"))
    assert calls == [0, 0]


@pytest.mark.usefixtures("cuda_standin")
def test_the_stand_in_keeps_the_real_calls_contracts() -> None:
    ops = cuda_ops()
    assert resolve_device("auto") == torch.device("cuda")  # CUDA "available" here
    with pytest.raises(ValueError, match="specified index"):
        ops.set_device(torch.device("cuda"))
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        ops.set_device(torch.device("cuda:3"))
    with ops.guard(torch.device("cuda")):  # torch.cuda.device takes an index-less device
        assert ops.current_device() == 0
    start, end = ops.event(), ops.event()
    with pytest.raises(RuntimeError, match="recorded"):
        start.elapsed_time(end)
    start.record()
    end.record()
    assert start.elapsed_time(end) >= 0.0


@pytest.mark.slow
def test_advise_on_cuda_runs_isolated_through_the_cuda_paths(
    cuda_standin: Path, tmp_path: Path
) -> None:
    """The CLI's default path on a GPU machine: `--device cuda`, trials in a worker process.
    Before the device seam, every worker failed to start here (set_device on a bare "cuda")."""
    out = tmp_path / "tuned.json"
    model = str(DATA / "tiny_cnn.py")
    r = advisor_cli("advise", model, "--device", "cuda", "--mode", "train", "--space", SPACE,
                    "--out", str(out), "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = load_config(out)
    assert cfg.environment.device_type == "cuda"
    assert cfg.environment.device_name == "CUDA stand-in (CPU)"
    # the grid (two layouts x three precisions), and cudnn.benchmark on one or two finalists:
    # as many as were accepted, which racing on a loaded machine can leave at one
    assert cfg.result is not None and cfg.result.trials >= 7
    log = _log(cuda_standin)
    workers = {e["pid"] for e in log if e["call"] == "set_device"}
    assert workers and all(e["arg"] == "0" for e in log if e["call"] == "set_device")
    # Every sample was timed with events, in a worker that made the device current first.
    timed = {e["pid"] for e in log if e["call"] == "event"}
    assert timed and timed <= workers


@pytest.mark.slow  # two stand-in workers (5 s)
@pytest.mark.usefixtures("cuda_standin")
def test_a_sticky_cuda_error_keeps_its_reason_and_the_worker_is_replaced() -> None:
    # After an illegal memory access every CUDA call fails, closing the candidate included: the
    # worker died as "exited with code 1" and the reason was lost (gpu_audit #13).
    from advisor.execute.isolate import IsolatedEvaluator
    from advisor.knobs import Settings
    from advisor.space import load_space
    from advisor.workload.args import make_workload

    cuda = torch.device("cuda")
    workload = make_workload(model_file=str(DATA / "poisons_on_channels_last.py"))
    ev = IsolatedEvaluator(workload.info, cuda, "infer", load_space(SPACE, cuda), timeout_s=120)
    try:
        bad = ev(Settings(memory_format="channels_last"))
        assert bad.status == "failed" and "illegal memory access" in (bad.reason or "")
        good = ev(Settings())  # in a fresh worker: the poisoned one was replaced
        assert good.status == "ok", good.reason
        assert ev.starts == 2
    finally:
        ev.close()


@pytest.mark.slow  # an isolated advise through the stand-in (11 s)
@pytest.mark.usefixtures("cuda_standin")
def test_pytorch_default_precision_is_never_rejected(tmp_path: Path) -> None:
    # On CUDA PyTorch's default is TF32 convs. A model where that differs from fp32 by more
    # than the space's TF32 tolerances made the default itself "rejected", and advise raised
    # "PyTorch's default configuration could not be measured" (gpu_audit #3).
    import advisor

    space = tmp_path / "tight.yaml"
    space.write_text(
        (DATA / "cuda_quick.yaml").read_text().replace("per_layer: false", "per_layer: false\n"
        "tolerances: {tf32: 1.0e-6}\ngrad_tolerances: {tf32: 1.0e-6}\n"
        "layer_tolerances: {tf32: 1.0e-6}\nrace: false")
    )  # fmt: skip
    advice = advisor.advise(model_file=str(DATA / "rounds_under_tf32.py"), mode="train",
                            device="cuda", space=str(space), storage="memory")  # fmt: skip
    by_label = dict(zip(advice.trials["label"], advice.trials["status"], strict=True))
    assert by_label["default"] == "ok"
    assert by_label["memory_format=channels_last"] == "ok"  # as close as the default path
    assert by_label["tf32=off"] == "ok"  # fp32 class: exact on this model
    (basis,) = advice.trials.loc[advice.trials["label"] == "default", "tolerance_basis"]
    assert "PyTorch's default path" in basis


BENCH_NET = (
    "import os, torch\nfrom torch import nn\n"
    "class Net(nn.Sequential):\n"
    "    def forward(self, x):\n"
    "        with open(os.environ['BENCH_LOG'], 'a') as f:\n"
    "            f.write(f'{os.getpid()} {torch.backends.cudnn.benchmark} {x.shape[0]}\\n')\n"
    "        return super().forward(x)\n"
    "def build_model():\n"
    "    torch.manual_seed(0)\n"
    "    return Net(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3))\n"
    "def example_inputs():\n    return (torch.randn(2, 3, 12, 12),)\n"
)


def _bench_forwards(log: Path) -> dict[int, set[str]]:
    """The cudnn.benchmark values each process's forwards ran under. (Loading a model file runs
    it once at batch 1 on the CPU, `model_file.check_runs`: no cuDNN there, left out.)"""
    out: dict[int, set[str]] = {}
    for line in log.read_text().splitlines():
        pid, value, batch = line.split()
        if batch != "1":
            out.setdefault(int(pid), set()).add(value)
    return out


@pytest.mark.slow  # isolated (7 s) and in-process (6.5 s): a worker for each value
@pytest.mark.usefixtures("cuda_standin")
@pytest.mark.parametrize("isolate", [True, False])
def test_cudnn_benchmark_values_never_share_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolate: bool
) -> None:
    # cuDNN's plan cache outlives a candidate and its key has no benchmark flag: a benchmark=True
    # candidate in a process that ran the same convs without it never benchmarks (gpu_audit #4).
    # Each value gets its own process, references included; finalists of both kinds are
    # re-timed in rounds, each sample taken where its finalist lives.
    from advisor.execute.make_evaluator import new_evaluator
    from advisor.knobs import Settings
    from advisor.space import load_space
    from advisor.workload.args import make_workload

    net, log = tmp_path / "bench_net.py", tmp_path / "bench.log"
    net.write_text(BENCH_NET)
    monkeypatch.setenv("BENCH_LOG", str(log))
    cuda = torch.device("cuda")
    workload = make_workload(model_file=str(net))
    ev = new_evaluator(workload, cuda, load_space(SPACE, cuda), "infer", isolate=isolate,
                       timeout_s=120)  # fmt: skip
    try:
        picks = [Settings(), Settings(cudnn_benchmark=True),
                 Settings(memory_format="channels_last", cudnn_benchmark=True)]  # fmt: skip
        results = [ev(s) for s in picks]
        assert [r.status for r in results] == ["ok"] * 3, [r.reason for r in results]
        trials = _bench_forwards(log)
        log.unlink()
        fresh = ev.retime(results)
    finally:
        ev.close()
    assert all(r.retimed and r.measurement is not None for r in fresh)
    assert all(len(r.measurement.samples_ms) >= 3 for r in fresh if r.measurement)
    retime = _bench_forwards(log)
    for forwards in (trials, retime):
        assert all(len(values) == 1 for values in forwards.values()), forwards  # never both
        assert set().union(*forwards.values()) == {"True", "False"}
    if not isolate:  # PyTorch's default stays in the caller's process, True goes to a worker
        import os

        assert trials[os.getpid()] == {"False"}
