"""What the advice is worth (benchmarks/retime.py): the interleaved rounds with an injected clock,
the figures from given samples (paired ratios, where the pick loses, when a one-off cost is
repaid), one process per distinct setting, and a real re-time of a tiny model: a process of its
own per setting, first calls apart, one sample a round."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks import retime
from tests.conftest import DATA


@dataclass
class _FakeWorker:
    """A worker that answers at once: its samples come from a list, and each takes the time
    the shared clock says (a step of `ms`)."""

    name: str
    ms: float
    clock: list[float]
    fail_at: int | None = None
    entry: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    taken: int = 0

    def __post_init__(self) -> None:
        self.entry.update(reps=1, warm_ms=self.ms)

    def send(self, do: str) -> None:
        assert do == "sample"

    def receive(self, until: float) -> dict[str, Any]:
        if self.fail_at is not None and self.taken == self.fail_at:
            raise RuntimeError("the process ended: boom")
        self.taken += 1
        self.clock[0] += self.ms / 1e3
        self.order.append(self.name)
        return {"ms": self.ms}


def test_rounds_alternate_and_stop_at_their_budget() -> None:
    now = [0.0]
    order: list[str] = []
    a, b = (_FakeWorker(n, ms, now, order=order) for n, ms in (("a", 10.0), ("b", 30.0)))
    n = retime.rounds([a, b], deadline=1000.0, round_s=0.2, clock=lambda: now[0])  # type: ignore[list-item]
    # 40 ms a round: the budget of 0.2 s a setting (0.4 s for both) is spent after 10 rounds
    assert n == 10 and a.entry["samples_ms"] == [10.0] * 10 and b.entry["samples_ms"] == [30.0] * 10
    assert order[:6] == ["a", "b", "b", "a", "a", "b"]  # A B, B A, ...


def test_each_sample_waits_for_the_last_samplers_threads_to_go_quiet() -> None:
    now = [0.0]
    starts: list[float] = []

    class _Timed(_FakeWorker):
        def receive(self, until: float) -> dict[str, Any]:
            starts.append(now[0])
            return super().receive(until)

    def sleep(s: float) -> None:
        now[0] += s

    a, b = _Timed("a", 10.0, now), _Timed("b", 10.0, now)
    n = retime.rounds([a, b], deadline=1000.0, round_s=0.2, clock=lambda: now[0],  # type: ignore[list-item]
                      quiet_s=0.02, sleep=sleep)  # fmt: skip
    # 60 ms a round (two samples of 10 ms, each 20 ms after the one before): 0.4 s is spent
    # after 7 rounds
    assert n == 7 and len(starts) == 14
    assert all(later - earlier == pytest.approx(0.03) for earlier, later in zip(starts, starts[1:]))
    now[0] = 0.0
    c = _Timed("c", 100.0, now)
    # 5 rounds of 100 ms fit in 2 s (7, with the planning's margin), not with a second's pause
    # before each sample
    assert retime.rounds([c], deadline=2.0, round_s=10.0, clock=lambda: now[0],  # type: ignore[list-item]
                         quiet_s=1.0, sleep=sleep) == 0  # fmt: skip
    assert "samples_ms" not in c.entry
    assert retime.rounds([c], deadline=2.0, round_s=10.0, clock=lambda: now[0],  # type: ignore[list-item]
                         sleep=sleep) >= 5  # fmt: skip


def test_rounds_end_before_the_deadline_and_need_five() -> None:
    now = [0.0]
    a = _FakeWorker("a", 100.0, now)
    assert retime.rounds([a], deadline=0.5, round_s=10.0, clock=lambda: now[0]) == 0  # type: ignore[list-item]
    assert "samples_ms" not in a.entry  # too little time for the 5 rounds a paired ratio needs
    now[0] = 0.0
    b = _FakeWorker("b", 100.0, now)
    n = retime.rounds([b], deadline=3.0, round_s=10.0, clock=lambda: now[0])  # type: ignore[list-item]
    assert n >= 5 and now[0] <= 3.0


def test_a_worker_that_fails_mid_way_leaves_every_worker_the_rounds_all_took() -> None:
    now = [0.0]
    a, b = _FakeWorker("a", 1.0, now), _FakeWorker("b", 1.0, now, fail_at=7)
    n = retime.rounds([a, b], deadline=1000.0, round_s=10.0, clock=lambda: now[0])  # type: ignore[list-item]
    assert n == 7 and len(a.entry["samples_ms"]) == 7
    assert b.entry["error"] == "a sample failed: the process ended: boom"


def _entry(label: str, samples: list[float], first: float = 0.5) -> dict[str, Any]:
    return {"label": label, "first_call_s": first, "samples_ms": samples}


def test_the_figures_pair_by_round_and_say_where_the_pick_loses() -> None:
    drift = [1.0 + 0.05 * (i % 4) for i in range(12)]  # the machine's drift hits every setting
    entries = {"default": _entry("default", [10 * d for d in drift]),
               "pick_quick": _entry("memory_format=channels_last", [8 * d for d in drift]),
               "hand": _entry("memory_format=channels_last, amp=bf16", [5 * d for d in drift]),
               "compile": _entry("torch.compile(mode='default')", [4 * d for d in drift], 30.0)}  # fmt: skip
    of = {"default": "default", "pick quick": "pick_quick", "hand": "hand", "compile": "compile"}
    got = retime.figures({"rounds": 12, "of": of, "entries": entries}, "cpu")
    assert got["vs_default"]["pick quick"] == [1.25, 1.25, 1.25]  # paired: the drift cancels
    assert got["vs_default"]["hand"] == [2.0, 2.0, 2.0]
    versus = got["pick_vs"]["pick quick"]
    assert versus["default"] == [1.25, 1.25, 1.25] and versus["hand"] == [0.625, 0.625, 0.625]
    assert got["loses_to"]["pick quick"] == ["hand", "compile"]
    # torch.compile's median step is 4.3 ms shorter (8.6 against 4.3) at a 30 s cold compile
    assert got["repaid_after_steps"]["pick quick"] == {"compile": round(30e3 / (4 * 1.075))}
    roles = got["roles"]
    assert roles["compile"]["one_off"] == "cold compile" and roles["hand"]["one_off"] is None
    assert roles["default"]["median_ms"] == pytest.approx(10 * 1.075)
    lo, hi = roles["default"]["ci_ms"]
    assert lo <= roles["default"]["median_ms"] <= hi and "samples_ms" not in roles["default"]


def test_a_role_that_shares_a_process_and_one_that_failed() -> None:
    entries = {"default": _entry("default", [10.0] * 6),
               "compile": {"label": "torch.compile(mode='default')",
                           "error": "its first call ran past the deadline (stopped after 9 s)"}}  # fmt: skip
    of = {"default": "default", "pick default": "default", "compile": "compile"}
    got = retime.figures({"rounds": 6, "of": of, "entries": entries}, "cuda", keep_samples=True)
    assert got["vs_default"]["pick default"] == [1.0, 1.0, 1.0]
    assert got["roles"]["pick default"]["process"] == "default"
    assert got["roles"]["compile"]["error"].startswith("its first call ran past")
    assert got["vs_default"]["compile"] is None and got["loses_to"]["pick default"] == []
    assert got["roles"]["default"]["samples_ms"] == [10.0] * 6  # kept where asked


def test_on_a_gpu_cudnn_benchmark_is_a_one_off_cost_too() -> None:
    entries = {"default": _entry("default", [2.0] * 5),
               "hand": _entry("memory_format=channels_last, amp=bf16, cudnn_benchmark=on",
                              [1.0] * 5, 12.0)}  # fmt: skip
    got = retime.figures({"rounds": 5, "of": {"default": "default", "hand": "hand"},
                          "entries": entries}, "cuda")  # fmt: skip
    assert got["roles"]["hand"]["one_off"] == "cuDNN's search"


def test_one_process_per_distinct_setting_and_the_rival_alone() -> None:
    procs, of = retime.processes({
        "default": {}, "pick quick": {"memory_format": "contiguous"},
        "pick default": {"memory_format": "channels_last"},
        "hand": {"memory_format": "channels_last"}, "compile": {"compile": "default"}})  # fmt: skip
    assert of == {"default": "default", "pick quick": "default", "pick default": "pick_default",
                  "hand": "pick_default", "compile": "compile"}  # fmt: skip
    assert set(procs) == {"default", "pick_default", "compile"}


@pytest.mark.parametrize("device, bf16, want", [
    ("cpu", True, {"memory_format": "channels_last", "amp": "bf16"}),
    ("cpu", False, {"memory_format": "channels_last"}),
    ("cuda", False, {"memory_format": "channels_last", "amp": "bf16", "cudnn_benchmark": True}),
])  # fmt: skip
def test_the_hand_setting(device: str, bf16: bool, want: dict[str, Any]) -> None:
    assert retime.hand_setting(device, bf16) == want


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config naming tests/data/tiny_cnn.py, as an advise run writes one."""
    from advisor.knobs import Settings
    from advisor.workload.build import model_workload
    from tests.conftest import cpu_config

    cfg = cpu_config(Settings()).model_copy(update={
        "workload": model_workload(str(DATA / "tiny_cnn.py")).info.model_dump(mode="json")})  # fmt: skip
    path = tmp_path_factory.mktemp("cfg") / "tiny.json"
    path.write_text(cfg.model_dump_json())
    return path


def test_a_real_retime_gives_each_setting_a_process_and_one_sample_a_round(
    tiny_config: Path,
) -> None:
    roles = {"default": {}, "pick quick": {}, "hand": {"memory_format": "channels_last"}}
    got = retime.retime(tiny_config, roles, "train", "cpu", time.perf_counter() + 120,
                        round_s=0.05, log=lambda _: None)  # fmt: skip
    assert got["of"] == {"default": "default", "pick quick": "default", "hand": "hand"}
    n = got["rounds"]
    assert n >= 5
    pids = {e["pid"] for e in got["entries"].values()}
    assert len(pids) == 2 and os.getpid() not in pids  # a process of its own each
    for name, e in got["entries"].items():
        assert "error" not in e, (name, e)
        assert e["ready_s"] > 0 and e["first_call_s"] > 0 and e["warm_ms"] > 0  # apart ...
        assert len(e["samples_ms"]) == n and all(ms > 0 for ms in e["samples_ms"])  # ... a round
    assert got["entries"]["hand"]["label"] == "memory_format=channels_last"
    json.dumps(retime.figures(got, "cpu"))  # a row's worth: plain JSON


def test_a_deadline_that_falls_during_start_up_stops_every_process(tiny_config: Path) -> None:
    t0 = time.perf_counter()
    got = retime.retime(tiny_config, {"default": {}, "compile": {"compile": "default"}}, "train",
                        "cpu", deadline=t0 + 2.5, round_s=0.1, log=lambda _: None)  # fmt: skip
    assert time.perf_counter() - t0 < 15  # no hang: the processes are killed, not waited for
    assert got["rounds"] == 0
    for e in got["entries"].values():
        assert "deadline" in e["error"] or "no time left" in e["error"], e


def test_the_retimes_training_step_computes_the_advisors_timed_gradients(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same loss at the same scale (a mean-reduced loss's): on a CPU, gradients that small
    reach subnormal floats in some models' fp32 backward, so a loss at another scale times
    another workload (it had the re-time disagree with the advisor's final check)."""
    import torch

    import advisor
    from advisor.config import Config
    from advisor.measure.candidate import Candidate
    from advisor.workload.rebuild import workload_from_info

    tuned: list[Any] = []  # what the re-time's advisor.apply returned
    real_apply = advisor.apply

    def keep(*args: Any, **kwargs: Any) -> Any:
        tuned.append(real_apply(*args, **kwargs))
        return tuned[-1]

    monkeypatch.setattr(advisor, "apply", keep)
    raw = json.loads(tiny_config.read_text())
    retime.build_variant(raw, "train", "cpu", {}).step()
    workload = workload_from_info(Config.model_validate(raw).workload)
    timed = Candidate(workload, advisor.Settings(), torch.device("cpu"), "train", seed=retime.SEED,
                      optimizer=False)  # fmt: skip
    timed.step()
    got = dict(tuned[0].model.named_parameters())
    want = dict(timed.tuned.module.named_parameters())
    assert got.keys() == want.keys()
    for name, p in want.items():
        assert p.grad is not None and p.grad.abs().max() > 0
        torch.testing.assert_close(got[name].grad, p.grad, msg=name)
