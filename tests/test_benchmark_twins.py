"""cudnn.benchmark is tried on the eager search's finalists (advisor/stages/benchmark_twins.py),
in one process of its own, and its cost is the search a fresh process pays.

The end-to-end test runs `advise --device cuda --effort quick` through the CUDA stand-in
(tests/standins/cuda_on_cpu.py): control flow, not speed. The bill's tests build results by hand
to check which first call the note and the payback read."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from advisor.advice import payback
from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.search.compile_bill import benchmark_note, benchmark_search_s, paid_by, paying
from advisor.space import candidates, load_space
from tests._cli import advisor_cli
from tests.conftest import DATA
from tests.test_cuda_standin import BENCH_NET, _bench_forwards

SPACE = str(DATA / "cuda_quick.yaml")


@pytest.mark.usefixtures("cuda_standin")
def test_the_grid_leaves_cudnn_benchmark_to_the_finalists() -> None:
    cuda = torch.device("cuda")
    cands, _ = candidates(load_space(SPACE, cuda), cuda)
    assert cands and not any(s.cudnn_benchmark for s in cands)
    assert len(cands) == 6  # 2 layouts x (fp32, TF32 convs, bf16 + TF32 convs)


@pytest.mark.slow  # an isolated quick advise through the stand-in (about 15 s)
@pytest.mark.usefixtures("cuda_standin")
def test_a_quick_cuda_run_searches_twice_at_most_in_one_process_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from advisor.config import load_config

    net, log, out = tmp_path / "bench_net.py", tmp_path / "bench.log", tmp_path / "tuned.json"
    net.write_text(BENCH_NET)
    monkeypatch.setenv("BENCH_LOG", str(log))
    r = advisor_cli("advise", str(net), "--device", "cuda", "--mode", "train", "--space", SPACE,
                    "--effort", "quick", "--storage", "memory", "--out", str(out),
                    "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with (tmp_path / "tuned.trials.csv").open() as f:
        trials = list(csv.DictReader(f))
    benchmarked = [t for t in trials if t["cudnn_benchmark"] == "True"]
    assert 1 <= len(benchmarked) <= 2, [t["label"] for t in trials]
    # each row names the stage that measured it, as the ledger holds it
    assert {t["stage"] for t in benchmarked} == {"cudnn.benchmark"}
    assert {t["stage"] for t in trials if t["cudnn_benchmark"] == "False"} == {"global knobs"}
    forwards = _bench_forwards(log)
    # The search's worker, the flag's, and the final check's fresh process at most: one CUDA
    # context for each kind of process. The flag's process runs its twins first, so cuDNN's
    # plans are searched before anything is cached; a twin gated there adds the gate's fp32
    # references after them (under PyTorch's default flag), and no other process runs the flag.
    assert len(forwards) <= 3, forwards
    order = _flag_order(log)
    flagged = [pid for pid, values in forwards.items() if "True" in values]
    assert len(flagged) == 1, forwards
    seq = order[flagged[0]]
    first_false = seq.index("False") if "False" in seq else len(seq)
    assert first_false > 0 and "True" not in seq[first_false:], seq
    cfg = load_config(out)
    assert cfg.result is not None and cfg.result.trials == 6 + len(benchmarked)
    # The flag's process loaded beside the search (`BenchmarkSplit.launch_on`), and the Time
    # line names what the twins still waited for it (0 where it was ready).
    assert "global knobs: process starts" in cfg.result.stage_s, cfg.result.stage_s


def _flag_order(log: Path) -> dict[int, list[str]]:
    """Each process's forwards' cudnn.benchmark values, in the order they ran (batch 1, the
    model file's load check on the CPU, left out as `_bench_forwards` does)."""
    out: dict[int, list[str]] = {}
    for line in log.read_text().splitlines():
        pid, value, batch = line.split()
        if batch != "1":
            out.setdefault(int(pid), []).append(value)
    return out


def _result(settings: Settings, median_ms: float, first_ms: float) -> TrialResult:
    m = Measurement(samples_ms=[median_ms] * 5, first_call_ms=first_ms)
    return TrialResult(settings=settings, status="ok", measurement=m, precision="fp32")


def test_the_search_cost_is_the_first_call_of_the_twin_that_searched() -> None:
    # Two twins with the same conv plan keys (TF32 for convs either way): the second found the
    # first's plans cached (2 ms) where the fresh process's search took 12.6 s.
    conv, on = Settings(tf32="conv"), Settings(tf32="on")
    first = _result(conv.model_copy(update={"cudnn_benchmark": True}), 20.0, 12_600.0)
    second = _result(on.model_copy(update={"cudnn_benchmark": True}), 19.0, 2.0)
    off = _result(on, 20.5, 30.0)
    results = [_result(Settings(), 22.0, 30.0), _result(conv, 21.0, 30.0), off, first, second]
    assert paid_by(second, results) is first
    assert paid_by(first, results) is first
    cost = benchmark_search_s(results, second)
    assert cost == pytest.approx(12.57)
    note = benchmark_note(results, second)
    assert note is not None and "12.6 s" in note and "8,380 steps" in note
    # Another layout has plans of its own: its first call is its own search.
    cl = _result(Settings(memory_format="channels_last", cudnn_benchmark=True), 18.0, 5_000.0)
    assert paid_by(cl, [*results, cl]) is cl
    # The Worth it line adds the search a training start pays to the tuning's own time.
    assert "paid back after 24,190 steps" in payback(60.0, results[0], second, 22.0 / 19.0, cost)


def test_a_search_that_does_not_pay_within_the_horizon_is_not_picked() -> None:
    off = _result(Settings(), 10.0, 30.0)
    twin = _result(Settings(cudnn_benchmark=True), 9.5, 12_530.0)  # 0.5 ms a step for 12.5 s
    kept, costly = paying([off, twin], off, Contest())
    assert kept == [off] and [r for r, _ in costly] == [twin]
    assert costly[0][1].steps == 25_000
    kept, costly = paying([off, twin], off, Contest(steps=200_000))  # the user trains long enough
    assert kept == [off, twin] and not costly


class _Session:
    """A re-time session whose worker was interrupted mid-sample: asked to close, it answers
    with the sample's unread reply (`_WorkerSession._expect` raises RetimeFailed)."""

    def __init__(self, events: list[str], interrupt: bool) -> None:
        self.events, self.interrupt = events, interrupt

    def sample(self, i: int) -> float:
        if self.interrupt:
            raise KeyboardInterrupt
        return 1.0

    def close(self) -> None:
        from advisor.execute.isolate import RetimeFailed

        self.events.append("close")
        raise RetimeFailed("'sample'")


def test_ctrl_c_during_a_split_re_time_stays_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200 run at 993ef73 stopped by Ctrl-C in its re-time wrote an answer instead: closing
    the sessions raised RetimeFailed over the interrupt, and the run went on as if the re-time
    had failed."""
    from advisor.execute.benchmark_processes import BenchmarkSplit
    from advisor.workload.build import model_workload

    events: list[str] = []
    space = load_space(str(DATA / "fast_cpu.yaml"), torch.device("cpu"))  # its timing policy
    on = SimpleNamespace(know=lambda checks: None)
    split = BenchmarkSplit(object(), lambda wl: on, model_workload(str(DATA / "tiny_cnn.py")), space)  # type: ignore[arg-type]
    opened = iter([False, True])  # the flag's own process is the one interrupted
    monkeypatch.setattr(BenchmarkSplit, "_open", lambda *a: _Session(events, next(opened)))
    results = [_result(Settings(), 10.0, 1.0), _result(Settings(cudnn_benchmark=True), 9.0, 1.0)]
    with pytest.raises(KeyboardInterrupt):
        split.retime(results)
    assert events == ["close", "close"]  # both sessions were still asked to close


class _Steady:
    """A re-time session whose finalists step in fixed times (`ms`, by finalist): the rounds'
    control flow, not a measurement. Each sample takes 10 ms of wall time, so the rounds pass
    the least time a decided re-time must span."""

    def __init__(self, ms: list[float]) -> None:
        self.ms = ms

    def sample(self, i: int) -> float:
        time.sleep(0.01)
        return self.ms[i]

    def close(self) -> None:
        pass


def test_a_split_re_time_stops_once_the_pick_is_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rounds driven across the two processes stop by the rule that stops them in one
    (`retime.stop_rule`): a twin twice as fast as the default is decided in a few rounds, where
    the policy's budget would take 200."""
    from advisor.execute.benchmark_processes import BenchmarkSplit
    from advisor.workload.build import model_workload

    space = load_space(str(DATA / "fast_cpu.yaml"), torch.device("cpu"))
    space = space.model_copy(update={"timing": space.timing.model_copy(
        update={"max_samples": 200, "max_time_s": 10.0})})  # fmt: skip
    on = SimpleNamespace(know=lambda checks: None)
    split = BenchmarkSplit(object(), lambda wl: on, model_workload(str(DATA / "tiny_cnn.py")), space)  # type: ignore[arg-type]
    times = iter([[10.0], [5.0]])  # the default's process, then the flag's
    monkeypatch.setattr(BenchmarkSplit, "_open", lambda *a: _Steady(next(times)))
    results = [_result(Settings(), 10.0, 1.0), _result(Settings(cudnn_benchmark=True), 5.0, 1.0)]
    fresh = split.retime(results)
    rounds = [len(r.measurement.samples_ms) for r in fresh if r.measurement is not None]
    assert rounds[0] == rounds[1] and 5 <= rounds[0] < 50, rounds
    assert all(r.retimed for r in fresh) and fresh[1].median_ms == 5.0
