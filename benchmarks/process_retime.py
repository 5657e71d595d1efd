"""Re-time variants of one model, each in a process of its own, interleaved across the processes.

fresh_retime.py times several variants in one fresh process; that process's first variant pays
the one-time costs for the others (cuDNN's benchmark search for a shape it already searched,
Inductor's start, a warm compile cache). Here every variant gets its own fresh process, its own
empty Inductor and Triton caches, and nothing else runs in it, so its first call is what a user
pays at training start: a cold `torch.compile`, cuDNN's search under `cudnn.benchmark`.

1. all processes start at once and set their variant up (fresh_retime.build_variant: the same
   `advisor.apply` as a user's, or the untouched model under `torch.compile` by hand);
2. one after another, each makes its first call, timed apart from the samples (a rival's first
   three too: fresh_retime.compile_first_calls), then warms up; those that compile last, so
   that a deadline that falls during a cold compile costs that variant alone;
3. rounds of one sample from each process in turn, in the advisor's alternating order (A B C D,
   D C B A, ...: `advisor.measure.timing.interleave`), while the others wait idle: a sample is
   the advisor's `Sampler` (CUDA events on a GPU; one untimed call before it, so it starts from
   a steady state after the other processes ran).

A variant is a Settings dict or `{"compile": MODE}` alone (fresh_retime.py). Every wait is
bounded by the deadline: a process that does not answer in time is killed and its row says at
which step. The worker side runs as

    python benchmarks/process_retime.py --worker MODEL_FILE MODE DEVICE VARIANT_JSON
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]

from fresh_retime import _stats  # noqa: E402

# A sample is at least this long (a shorter step is repeated back to back within it), as the
# cuda space's `min_sample_ms`: one launch per sample would time the host's launch latency.
MIN_SAMPLE_MS = 1.0
WARMUP_S = 0.2  # after the first call: lazy initialisation that the first call left
ROUNDS_MIN = 5  # paired ratios need at least 5 rounds (advisor.measure.stats.paired_speedup)


# ======================================================================== the worker


def _worker(argv: list[str]) -> None:
    """One variant in this process: set up, then answer the parent's requests, one JSON line
    each, until it says quit or closes stdin."""
    # The protocol keeps the real stdout; anything a library prints goes to stderr instead.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    began = time.perf_counter()

    def send(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")

    import warnings

    import torch
    from fresh_retime import build_variant, compile_first_calls
    from process_spread import _config

    from advisor.device.allocator import settle_cpu_allocator
    from advisor.errors import first_line
    from advisor.measure.timing import Sampler, TimingPolicy, reps_for, synchronize
    from advisor.workload.rebuild import workload_from_info

    warnings.simplefilter("ignore")
    model, mode, device, variant_json = argv
    try:
        settle_cpu_allocator()  # timed from the allocator state of a training loop, as fresh_retime
        dev = torch.device(device)
        with tempfile.TemporaryDirectory() as tmp:
            cfg_path = _config(Path(model), mode, device, Path(tmp))
            from advisor.config import load_config

            cfg = load_config(cfg_path)
        workload = workload_from_info(cfg.workload)
        x, kw = workload.make_call(dev, seed=7)
        gs: list[torch.Tensor] = []
        v = build_variant(cfg, workload, x, kw, json.loads(variant_json), mode == "train", gs, dev)
    except Exception as e:  # noqa: BLE001 - the parent records it as the variant's row
        send({"error": f"set-up: {first_line(e)}"})
        return
    send({"ready_s": time.perf_counter() - began, "label": v.label, "pid": os.getpid()})
    sampler = Sampler(dev)
    reps = 1
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["do"] == "first":
                entry: dict[str, Any] = {}
                if v.compile_mode:
                    entry.update(compile_first_calls(v, dev))
                    entry["first_call_s"] = entry["compile_s"]
                else:  # a pick that compiles: its compile, as `advisor.apply` gives it
                    synchronize(dev)
                    t0 = time.perf_counter()
                    v.step()
                    synchronize(dev)
                    entry["first_call_s"] = time.perf_counter() - t0
                n, t0 = 0, time.perf_counter()
                while n < 3 or time.perf_counter() - t0 < WARMUP_S:
                    v.step()
                    n += 1
                synchronize(dev)
                warm_ms = (time.perf_counter() - t0) * 1e3 / n
                reps = reps_for(warm_ms, TimingPolicy(min_sample_ms=MIN_SAMPLE_MS))
                send({**entry, "warm_ms": warm_ms, "reps": reps})
            elif cmd["do"] == "sample":
                send({"ms": sampler(v.step, reps)})
            else:
                break
        except Exception as e:  # noqa: BLE001 - the parent records it as the variant's row
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
        """End the worker and whatever it started (Inductor's compile workers): its process
        group, which may outlive the worker itself."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def _start(name: str, model: Path, mode: str, device: str, variant: dict[str, Any],
           work: Path) -> _Worker:  # fmt: skip
    caches = work / name  # empty: a compile in this process is a cold one
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", ""))
                                         if p),
           "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "TRITON_CACHE_DIR": str(caches / "triton")}  # fmt: skip
    caches.mkdir(parents=True, exist_ok=True)
    log = open(caches / "stderr.txt", "w+")  # noqa: SIM115 - closed by _Worker.stop
    cmd = [sys.executable, __file__, "--worker", str(model), mode, device, json.dumps(variant)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                            text=True, cwd=ROOT, env=env, start_new_session=True)  # fmt: skip
    return _Worker(name, proc, log)


def retime_in_processes(
    model: Path,
    variants: dict[str, dict[str, Any]],
    mode: str,
    device: str,
    deadline: float,
    round_s: float = 1.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Re-time `variants` (name -> settings dict), each in a process of its own (the module's
    docstring), within `deadline` (a `time.perf_counter()` value). Returns, per name, its label,
    `ready_s` (start-up and set-up), `first_call_s` (a rival's `compile_s` and `first3_s` too),
    `warm_ms`, `reps` and the samples' statistics (fresh_retime's), or `error` saying which step
    failed or ran out of time; and under "rounds" how many interleaved rounds were taken (sample
    i of every variant is from round i: `advisor.measure.stats.paired_speedup` pairs them)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="process-retime-") as tmp:
        workers = [_start(n, model, mode, device, v, Path(tmp)) for n, v in variants.items()]
        try:
            # Kept for the rounds: half their planned time (they take what the first calls leave,
            # up to `round_s` a variant); start-up and first calls must end before it.
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
            # First calls one at a time (nothing else runs meanwhile), those that compile last:
            # a deadline that falls during a cold compile then costs that variant alone.
            alive.sort(key=lambda w: variants[w.name].get("compile", "off") != "off")
            for w in list(alive):
                t0 = time.perf_counter()
                try:
                    w.send("first")
                    w.entry.update(w.receive(deadline - keep))
                    log(f"  {w.name}: first call {w.entry['first_call_s']:.2f} s, "
                        f"then {w.entry['warm_ms']:.3g} ms a step")  # fmt: skip
                except _Late:
                    w.entry["error"] = (f"its first call ran past the deadline (stopped after "
                                        f"{time.perf_counter() - t0:.0f} s)")  # fmt: skip
                except (RuntimeError, OSError) as e:  # OSError: it died before the request
                    w.entry["error"] = str(e)
                if "error" in w.entry:
                    alive.remove(w)
                    w.stop()
            out["rounds"] = _rounds(alive, deadline, round_s)
            if alive and out["rounds"] == 0:
                for w in alive:
                    w.entry.setdefault("error", "no time left for the interleaved rounds")
        finally:
            for w in workers:
                w.stop()
        for w in workers:
            out[w.name] = w.entry
    return out


def _rounds(alive: list[_Worker], deadline: float, round_s: float) -> int:
    """Interleaved rounds across `alive` until each has had `round_s` of rounds (at least
    ROUNDS_MIN) or the deadline nears; samples land in each worker's entry. A worker that fails
    mid-way is stopped, and every worker keeps only the rounds all finished."""
    from advisor.measure.timing import interleave

    if not alive:
        return 0
    per_round_s = sum(2 * w.entry["reps"] * w.entry["warm_ms"] / 1e3 for w in alive) + 0.002
    left = deadline - time.perf_counter()
    most = int(left / per_round_s * 0.8)  # answers and slow samples: a margin
    if most < ROUNDS_MIN:
        return 0
    failed: list[str] = []

    def sampler(w: _Worker) -> Callable[[], float]:
        def one() -> float:
            if failed:
                return math.nan
            try:
                w.send("sample")
                return float(w.receive(deadline)["ms"])
            except (_Late, RuntimeError, OSError) as e:
                w.entry["error"] = f"a sample failed: {e or 'the deadline'}"
                failed.append(w.name)
                return math.nan

        return one

    def stop(_: list[list[float]]) -> bool:  # a failed worker, or the deadline a round away
        return bool(failed) or time.perf_counter() + 2 * per_round_s > deadline

    samples = interleave([sampler(w) for w in alive], time.perf_counter, min_rounds=ROUNDS_MIN,
                         max_rounds=most, budget_s=round_s, decided=stop)  # fmt: skip
    n = min(
        (next((i for i, s in enumerate(ms) if math.isnan(s)), len(ms)) for ms in samples),
        default=0,
    )
    if n < ROUNDS_MIN:
        n = 0
    for w, ms in zip(alive, samples, strict=True):
        if "error" not in w.entry and n:
            w.entry.update(_stats(ms[:n]))
        elif "error" not in w.entry:
            w.entry["error"] = f"too few interleaved rounds ({failed[0]} failed)"
    return n


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    if sys.argv[1] == "--worker" and len(sys.argv) == 6:
        _worker(sys.argv[2:])
        sys.exit(0)
    sys.exit("process_retime: the parent is retime_in_processes(); see --help")
