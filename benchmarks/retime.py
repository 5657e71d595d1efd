"""What the advice is worth: settings re-timed in fresh processes, one per setting, interleaved.

For one model and mode (the workload of a config an advise run wrote), each distinct setting
gets a process of its own with empty Inductor and Triton caches, and nothing else runs in it, so
its first call is what a user pays at training start (a cold `torch.compile`, cuDNN's search
under `cudnn.benchmark`):

1. all processes start at once and set their setting up: `advisor.apply` on their own copy of
   the model, as a user's training script does, or the untouched model under `torch.compile`
   by hand (the rival);
2. one after another, each makes its first call, timed apart from the samples, then warms up;
   those that compile go last, so that a deadline falling during a cold compile costs that
   setting alone;
3. rounds of one sample from each process in turn, in rotating order (A B C D, B C D A, ...:
   `advisor.measure.timing.interleave`) while the others wait idle: a sample is the advisor's
   `Sampler` (CUDA events on a GPU) over enough back-to-back steps to fill `MIN_SAMPLE_MS`,
   after one untimed step. On a CPU each sample waits `QUIET_S` first, so that the last
   sampler's idle OpenMP threads have stopped spinning. Sample i of every setting is from
   round i, so ratios are paired by round (`advisor.measure.stats.paired_speedup`: drift that
   hits a round cancels in it).

The roles: PyTorch's default, the advisor's pick (one per effort), the hand setting
(channels_last, + bf16 autocast where the CPU has bf16 units or on a GPU, + cudnn.benchmark on
a GPU) and `torch.compile` in its default mode. A role whose setting another has (a pick that
is the default) shares that process. Every wait is bounded by the deadline: a process that does
not answer in time is killed, and its entry says at which step. The worker side runs as

    python -m benchmarks.retime --worker CONFIG MODE DEVICE SETTING_JSON
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.registry import ROOT
from benchmarks.table import child_env

SEED = 7  # the inputs' draw; the loss's is SEED + 1, as the advisor's Candidate(seed=SEED)
MIN_SAMPLE_MS = 1.0  # a shorter step is repeated back to back within a sample (launch latency)
WARMUP_S = 0.2  # after the first call: lazy initialisation the first call left
ROUNDS_MIN = 5  # paired ratios need at least 5 rounds
# On a CPU, the pause before each sample. After a step, libgomp's idle threads spin for
# milliseconds before they sleep: a sample taken at once in the next process shares the cores
# with them. On a 2-core Zen 4, relu_bn_block's 2-3 ms steps then came in two modes, a third of
# them about 4 ms slower (an interquartile range above the median); after a 10 or 20 ms pause,
# within 4-8% of it. Steps of 40 ms read the same either way.
QUIET_S = 0.02
COMPILE = {"compile": "default"}
ONE_OFF = {"compile": "cold compile", "cudnn": "cuDNN's search"}


def hand_setting(device: str, bf16_units: bool) -> dict[str, Any]:
    """What a user sets by hand: channels_last, + bf16 autocast where bf16 is computed in
    hardware (a CPU with AVX-512 BF16 or AMX, or a GPU), + cudnn.benchmark on a GPU."""
    hand: dict[str, Any] = {"memory_format": "channels_last"}
    if device.startswith("cuda") or bf16_units:
        hand["amp"] = "bf16"
    if device.startswith("cuda"):
        hand["cudnn_benchmark"] = True
    return hand


# ======================================================================== the worker


@dataclass
class Variant:
    """One setting as a user gets it; `step` is one training (or inference) step of it."""

    label: str
    step: Callable[[], None]
    compiles: bool  # its first call compiles (the rival, or a pick with compile on)


def build_variant(raw: dict[str, Any], mode: str, device: str, setting: dict[str, Any]) -> Variant:
    """`setting` (a Settings dict, or {"compile": MODE} alone: the rival) applied to a fresh
    copy of the workload in `raw` (a config's JSON, of any revision: only its workload and mode
    are read, into a config of this tree's advisor)."""
    import torch

    import advisor
    from advisor.config import Config
    from advisor.device.environment import current_environment
    from advisor.execute.runner import flatten_tensors
    from advisor.measure.candidate import loss_weights
    from advisor.workload.rebuild import workload_from_info

    dev = torch.device(device)
    rival = set(setting) == {"compile"}
    settings = advisor.Settings() if rival else advisor.Settings.model_validate(setting)
    cfg = Config(advisor_version=advisor.__version__, mode=mode, settings=settings,
                 environment=current_environment(dev), workload=raw["workload"], space="none")  # fmt: skip
    workload = workload_from_info(cfg.workload)
    x, kw = workload.make_call(dev, seed=SEED)
    training = mode == "train"
    tuned = advisor.apply(cfg, workload.make_model().train(training), device=dev)
    xt = tuned.inputs(*x)
    kwt = dict(zip(kw, tuned.inputs(*kw.values()), strict=True))
    net: Any = torch.compile(tuned.model, mode=setting["compile"]) if rival else tuned.model
    seeds: list[torch.Tensor] = []  # the loss's weights: fixed random draws, drawn once

    def step() -> None:
        if not training:
            with torch.no_grad(), tuned.autocast():
                net(*xt, **kwt)
            return
        tuned.model.zero_grad(set_to_none=True)
        with tuned.autocast():
            outs = [o for o in flatten_tensors(net(*xt, **kwt)) if o.is_floating_point()]
        if not seeds:  # the advisor's timed loss, at its scale (what training's gradients are)
            seeds.extend(loss_weights(outs, SEED + 1))
        sum((o.to(g.dtype) * g).sum() for o, g in zip(outs, seeds, strict=True)  # type: ignore[union-attr]
            if o.requires_grad).backward()  # fmt: skip

    name = f"torch.compile(mode={setting['compile']!r})" if rival else settings.label()
    return Variant(name, step, rival or settings.compile != "off")


def _worker(argv: list[str]) -> None:
    """One setting in this process: set up, then answer the parent's requests, one JSON line
    each, until it says quit or closes stdin."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol keeps the real stdout
    os.dup2(2, 1)  # anything a library prints goes to stderr
    began = time.perf_counter()

    def send(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")

    import warnings

    import torch

    from advisor.device.allocator import keep_cpu_buffers_resident
    from advisor.errors import first_line
    from advisor.measure.stopping import TimingPolicy
    from advisor.measure.timing import Sampler, reps_for, synchronize

    warnings.simplefilter("ignore")
    config, mode, device, setting = argv
    try:
        keep_cpu_buffers_resident()  # timed from the allocator state of a training loop
        v = build_variant(json.loads(Path(config).read_text()), mode, device, json.loads(setting))
    except Exception as e:  # noqa: BLE001 - the parent records it as the setting's entry
        send({"error": f"set-up: {first_line(e)}"})
        return
    dev = torch.device(device)
    send({"ready_s": time.perf_counter() - began, "label": v.label, "pid": os.getpid()})
    sampler, reps = Sampler(dev), 1
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["do"] == "first":
                synchronize(dev)
                t0 = time.perf_counter()
                v.step()
                synchronize(dev)
                first = time.perf_counter() - t0
                n, t0 = 0, time.perf_counter()
                while n < 3 or time.perf_counter() - t0 < WARMUP_S:
                    v.step()
                    n += 1
                synchronize(dev)
                warm_ms = (time.perf_counter() - t0) * 1e3 / n
                reps = reps_for(warm_ms, TimingPolicy(min_sample_ms=MIN_SAMPLE_MS))
                send({"first_call_s": first, "warm_ms": warm_ms, "reps": reps})
            elif cmd["do"] == "sample":
                v.step()  # untimed: a steady state after the other processes ran
                send({"ms": sampler(v.step, reps)})
            else:
                break
        except Exception as e:  # noqa: BLE001 - the parent records it as the setting's entry
            send({"error": f"{cmd['do']}: {first_line(e)}"})
            return


# ======================================================================== the parent


class _Late(Exception):
    """A worker did not answer before its deadline."""


@dataclass
class _Worker:
    name: str
    proc: subprocess.Popen[str]
    log: IO[str]
    entry: dict[str, Any] = field(default_factory=dict)
    buffer: str = ""

    def send(self, do: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"do": do}) + "\n")
        self.proc.stdin.flush()

    def receive(self, until: float) -> dict[str, Any]:
        """The worker's next answer, or _Late once `until` (a perf_counter value) passed; a
        worker that died says why in its last line of stderr."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while "\n" not in self.buffer:
                left = until - time.perf_counter()
                if left <= 0 or not sel.select(timeout=left):
                    raise _Late
                chunk = os.read(fd, 65536).decode()
                if not chunk:
                    raise RuntimeError(f"the process ended: {self.last_words()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split("\n", 1)
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def last_words(self) -> str:
        self.log.flush()
        lines = [ln.strip() for ln in Path(self.log.name).read_text().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else f"exit code {self.proc.poll()}"

    def stop(self) -> None:
        """End the worker and what it started (Inductor's compile workers): its process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def _start(name: str, config: Path, mode: str, device: str, setting: dict[str, Any],
           work: Path) -> _Worker:  # fmt: skip
    caches = work / name  # empty: a compile in this process is a cold one
    caches.mkdir(parents=True, exist_ok=True)
    env = child_env(ROOT, {"TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
                           "TRITON_CACHE_DIR": str(caches / "triton")})  # fmt: skip
    log = open(caches / "stderr.txt", "w+")  # noqa: SIM115 - closed by _Worker.stop
    cmd = [sys.executable, "-m", "benchmarks.retime", "--worker", str(config), mode, device,
           json.dumps(setting)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                            text=True, cwd=ROOT, env=env, start_new_session=True)  # fmt: skip
    return _Worker(name, proc, log)


def processes(roles: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """One process per distinct setting: (process name -> setting, role -> process name). A
    role whose setting an earlier one has shares its process; the rival never does."""
    from advisor.knobs import Settings

    procs: dict[str, dict[str, Any]] = {}
    of: dict[str, str] = {}
    for role, setting in roles.items():
        same = None
        if set(setting) != {"compile"}:
            want = Settings.model_validate(setting)
            same = next((p for p, s in procs.items() if set(s) != {"compile"}
                         and Settings.model_validate(s) == want), None)  # fmt: skip
        of[role] = same or role.replace(" ", "_")
        if same is None:
            procs[of[role]] = setting
    return procs, of


def retime(config: Path, roles: dict[str, dict[str, Any]], mode: str, device: str,
           deadline: float, round_s: float = 1.0,
           log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Re-time `roles` (role -> setting) on `config`'s workload, a process per distinct
    setting (the module's docstring), within `deadline` (a `time.perf_counter()` value).
    Returns {"rounds": n, "of": role -> process, "entries": process -> its label, `ready_s`,
    `first_call_s`, `warm_ms`, `reps`, `pid` and `samples_ms` (one a round), or `error`}."""
    procs, of = processes(roles)
    with tempfile.TemporaryDirectory(prefix="benchmarks-retime-") as tmp:
        workers = [_start(n, config, mode, device, s, Path(tmp)) for n, s in procs.items()]
        try:
            # Kept for the rounds (they take what the first calls leave, up to `round_s` a
            # setting): start-up and first calls must end before it.
            keep = max(2.0, 0.5 * len(workers) * round_s)
            alive = []
            for w in workers:  # they started together: waiting on each in turn waits for all
                try:
                    w.entry.update(w.receive(deadline - keep))
                    alive.append(w)
                    log(f"  {w.name}: ready in {w.entry['ready_s']:.1f} s")
                except _Late:
                    w.entry["error"] = "not set up before the deadline"
                except RuntimeError as e:
                    w.entry["error"] = str(e)
            alive.sort(key=lambda w: "compile" in procs[w.name]
                       and procs[w.name]["compile"] not in (None, "off"))  # fmt: skip
            for w in list(alive):
                t0 = time.perf_counter()
                try:
                    w.send("first")
                    w.entry.update(w.receive(deadline - keep))
                    log(f"  {w.name}: first call {w.entry['first_call_s']:.2f} s, then "
                        f"{w.entry['warm_ms']:.3g} ms a step")  # fmt: skip
                except _Late:
                    w.entry["error"] = (f"its first call ran past the deadline (stopped after "
                                        f"{time.perf_counter() - t0:.0f} s)")  # fmt: skip
                except (RuntimeError, OSError) as e:  # OSError: it died before the request
                    w.entry["error"] = str(e)
                if "error" in w.entry:
                    alive.remove(w)
                    w.stop()
            quiet_s = 0.0 if device.startswith("cuda") else QUIET_S
            n = rounds(alive, deadline, round_s, quiet_s=quiet_s)
            if alive and n == 0:
                for w in alive:
                    w.entry.setdefault("error", "no time left for the interleaved rounds")
        finally:
            for w in workers:
                w.stop()
    return {"rounds": n, "of": of, "entries": {w.name: w.entry for w in workers}}


def rounds(alive: list[_Worker], deadline: float, round_s: float,
           clock: Callable[[], float] = time.perf_counter, quiet_s: float = 0.0,
           sleep: Callable[[float], None] = time.sleep) -> int:  # fmt: skip
    """Interleaved rounds across `alive` until each had `round_s` of them (at least
    ROUNDS_MIN) or the deadline nears; each worker's `samples_ms` holds one sample a round,
    taken `quiet_s` after the sample before it. A worker that fails mid-way ends the rounds;
    every worker keeps only the rounds all took."""
    from advisor.measure.timing import interleave

    if not alive:
        return 0
    per_round_s = sum(2 * w.entry["reps"] * w.entry["warm_ms"] / 1e3 + quiet_s
                      for w in alive) + 0.002  # fmt: skip
    most = int((deadline - clock()) / per_round_s * 0.8)  # answers and slow samples: a margin
    if most < ROUNDS_MIN:
        return 0
    failed: list[str] = []

    def sampler(w: _Worker) -> Callable[[], float]:
        def one() -> float:
            if failed:
                return math.nan
            try:
                sleep(quiet_s)
                w.send("sample")
                return float(w.receive(deadline)["ms"])
            except (_Late, RuntimeError, OSError) as e:
                w.entry["error"] = f"a sample failed: {e or 'the deadline'}"
                failed.append(w.name)
                return math.nan

        return one

    def stop(_: list[list[float]]) -> bool:  # a failed worker, or the deadline a round away
        return bool(failed) or clock() + 2 * per_round_s > deadline

    samples = interleave([sampler(w) for w in alive], clock, min_rounds=ROUNDS_MIN,
                         max_rounds=most, budget_s=round_s, decided=stop)  # fmt: skip
    n = min((next((i for i, s in enumerate(ms) if math.isnan(s)), len(ms)) for ms in samples),
            default=0)  # fmt: skip
    n = n if n >= ROUNDS_MIN else 0
    for w, ms in zip(alive, samples, strict=True):
        if "error" not in w.entry and n:
            w.entry["samples_ms"] = ms[:n]
        elif "error" not in w.entry:
            w.entry["error"] = f"too few interleaved rounds ({failed[0]} failed)"
    return n


# ======================================================================== the figures


def _paired(base: list[float] | None, other: list[float] | None) -> list[float] | None:
    """base / other per round: median and 95% interval (above 1: `other` is faster)."""
    from advisor.measure.stats import Measurement, paired_speedup

    if not base or not other:
        return None
    try:
        got = paired_speedup(Measurement(samples_ms=base), Measurement(samples_ms=other))
    except ValueError:
        return None
    return [round(x, 4) for x in got]


def figures(result: dict[str, Any], device: str, keep_samples: bool = False) -> dict[str, Any]:
    """The table's `worth`: per role its label, median and 95% CI (ms), first call (s) and the
    one-off cost it carries, or its error; each role against the default and against the pick
    (paired by round); the roles the pick loses to beyond noise; and, for an alternative
    faster than the pick with a one-off cost, after how many steps that cost is repaid."""
    from advisor.measure.stats import Measurement

    out: dict[str, Any] = {"rounds": result["rounds"], "roles": {}}
    entries, of = result["entries"], result["of"]
    picks = [r for r in of if r.startswith("pick")]
    for role, proc in of.items():
        e = entries.get(proc, {})
        got: dict[str, Any] = {"label": e.get("label"), "process": proc}
        if "error" in e:
            got["error"] = e["error"]
        if "first_call_s" in e:
            got["first_call_s"] = round(e["first_call_s"], 3)
            label = str(e.get("label"))
            cost = [ONE_OFF["compile"]] if "compile" in label else []
            if device.startswith("cuda") and "cudnn_benchmark=on" in label:
                cost.append(ONE_OFF["cudnn"])
            got["one_off"] = ", ".join(cost) or None
        if e.get("samples_ms"):
            m = Measurement(samples_ms=e["samples_ms"])
            got.update(median_ms=round(m.median_ms, 5), ci_ms=[round(m.ci_low_ms, 5),
                       round(m.ci_high_ms, 5)], iqr_ms=round(m.iqr_ms, 5))  # fmt: skip
            if keep_samples:
                got["samples_ms"] = e["samples_ms"]
        out["roles"][role] = got

    def samples(role: str) -> list[float] | None:
        return entries.get(of.get(role, ""), {}).get("samples_ms")

    out["vs_default"] = {r: _paired(samples("default"), samples(r)) for r in of if r != "default"}
    for pick in picks:
        versus = {r: _paired(samples(r), samples(pick)) for r in of if r != pick}
        out.setdefault("pick_vs", {})[pick] = versus
        # alternative time / pick time: the whole interval below 1 is the pick slower
        loses = [r for r, s in versus.items() if s is not None and s[2] < 1.0
                 and not r.startswith("pick")]  # fmt: skip
        out.setdefault("loses_to", {})[pick] = loses
        for r in loses:
            alt, mine = out["roles"][r], out["roles"][pick]
            saved = mine.get("median_ms", 0) - alt.get("median_ms", 0)
            if alt.get("one_off") and saved > 0:
                out.setdefault("repaid_after_steps", {}).setdefault(pick, {})[r] = round(
                    alt["first_call_s"] * 1e3 / saved)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
        sys.exit(0)
    print(__doc__)
    sys.exit(2)
