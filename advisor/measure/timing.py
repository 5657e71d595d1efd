"""Honest timing: synchronised, warmed up, repeated until the median is known, raw samples kept.

`measure()` runs a step once (its first-call cost recorded apart: lazy init, cuDNN's benchmark
search, Triton compilation), warms up (on a CPU, the first step in its layout in a process until
it has stopped getting faster: `settle`), then samples until the median's 95% confidence
interval is within `target_rel_ci` of it or `max_time_s` is spent. Every sample, in a trial and
in the interleaved re-time alike, is taken by one `Sampler`: CUDA events on a GPU, a
synchronised host clock elsewhere (injectable, so tests of the statistics are exact). A step
shorter than the policy's `min_sample_ms` is repeated back to back within one sample, so a
sample is not dominated by launch latency or clock overhead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from advisor.allowance import over_allowance, stop_after
from advisor.device.ops import cuda_ops, device_guard
from advisor.measure.gpu_clock import hold_gpu
from advisor.measure.settle import settling
from advisor.measure.stats import Measurement, Race
from advisor.measure.stop import Sampling
from advisor.measure.stopping import TimingPolicy, batch_size, enough

Clock = Callable[[], float]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        cuda_ops().synchronize(device)


def reps_for(step_ms: float, policy: TimingPolicy) -> int:
    """Calls per sample: enough back-to-back calls to fill `min_sample_ms` (1 when off)."""
    if policy.min_sample_ms <= 0 or step_ms >= policy.min_sample_ms:
        return 1
    return max(1, min(policy.max_reps, math.ceil(policy.min_sample_ms / max(step_ms, 1e-6))))


class Sampler:
    """Takes one timing sample of a step: the time per call of `reps` back-to-back calls.

    The one clock for trials and the interleaved re-time: CUDA events on a GPU (unless a clock is
    injected), a host clock between two synchronisations elsewhere. `flush` runs before each
    sample, outside the timed span (an L2 flush, so per-layer samples start from a cold cache).
    With `queue_ahead` (CUDA, per-layer timing) the GPU is held by a sleep kernel while the host
    enqueues the calls, so the sample is the device's time for the layer, as inside a model where
    the layers before it keep the queue full, not the host's launch latency.
    """

    def __init__(
        self,
        device: torch.device,
        clock: Clock | None = None,
        flush: Callable[[], None] | None = None,
        queue_ahead: bool = False,
    ) -> None:
        self.device = device
        self.use_events = device.type == "cuda" and clock is None
        self.clock = clock or time.perf_counter
        self.flush = flush
        self.queue_ahead = queue_ahead and self.use_events
        self.launch_ms = 0.0  # host time to enqueue one call (measured during warm-up)

    def __call__(self, fn: Callable[[], object], reps: int = 1) -> float:
        if self.use_events and self.flush is not None:
            return self._cold_device_time(fn, reps)
        if self.flush is not None:
            self.flush()
        if self.use_events:
            ev0, ev1 = cuda_ops().event(), cuda_ops().event()
            if self.queue_ahead:
                hold_gpu(self.device, 1.5 * reps * self.launch_ms + 0.02)
            else:
                # A whole step in steady state, as in a training loop: one untimed call first, so
                # the timed ones start where it ends instead of on an idle GPU that waits for the
                # host's first launch (that latency would be inside every sample: a few % of a
                # 1-5 ms step). A host-bound step still shows: the GPU then waits for the host.
                fn()
            ev0.record()
            for _ in range(reps):
                fn()
            ev1.record()
            ev1.synchronize()
            return ev0.elapsed_time(ev1) / reps
        synchronize(self.device)
        t = self.clock()
        for _ in range(reps):
            fn()
        synchronize(self.device)
        return (self.clock() - t) * 1e3 / reps

    def batch(self, fn: Callable[[], object], reps: int, count: int) -> list[float]:
        """`count` samples of a whole step back to back: on a GPU one untimed call, an event
        after each sample and one synchronisation for all (a sample at a time would pay an
        untimed call and a synchronisation each: up to half of a short step's sampling)."""
        if count <= 1 or not self.use_events or self.flush is not None or self.queue_ahead:
            return [self(fn, reps)]  # elsewhere one at a time: nothing to save, nothing to waste
        events = [cuda_ops().event() for _ in range(count + 1)]
        fn()
        events[0].record()
        for end in events[1:]:
            for _ in range(reps):
                fn()
            end.record()
        events[-1].synchronize()
        return [a.elapsed_time(b) / reps for a, b in zip(events, events[1:], strict=False)]

    def _cold_device_time(self, fn: Callable[[], object], reps: int) -> float:
        """A per-layer sample on a GPU: every call starts from a cold L2 (flushed before each,
        outside its events) and the GPU is held while the calls are queued, so each span is the
        device's time for the layer alone."""
        assert self.flush is not None
        ops = cuda_ops()
        spans = [(ops.event(), ops.event()) for _ in range(reps)]
        hold_gpu(self.device, 1.5 * reps * self.launch_ms + 0.02)
        for start, end in spans:
            self.flush()
            start.record()
            fn()
            end.record()
        spans[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in spans) / reps


def warm_up(
    steps: Sequence[Callable[[], object]],
    before: Sequence[Callable[[], None]],
    runs: int,
    clock: Clock,
    first_ms: list[float] | None = None,
    device: torch.device | None = None,
    settle_s: float = TimingPolicy.max_time_s,
    settles: Sequence[bool] | None = None,
) -> list[float]:
    """Run each step `runs` times (at least once), `before[i]` first, and, on a CPU `device`
    where `runs` asks for runs after the first call, on until the step has stopped getting
    faster (`settling`, for at most `settle_s` a step; only the steps `settles` names, where
    given: the first in their layout in the process, `settle.settles`); the host's time per
    call of each (what `Sampler.launch_ms` needs to hold a GPU for queued calls). `first_ms`
    receives each step's first call (host time: a compile, lazy initialisation)."""
    cpu = device is not None and device.type != "cuda" and runs > 1
    launch_ms = []
    for i, (step, prep) in enumerate(zip(steps, before, strict=True)):
        settle = cpu and (settles is None or settles[i])
        t = 0.0
        after_first: list[float] = []  # each later run's time: whether the step has settled
        run = 0
        until = clock() + settle_s
        while run < max(1, runs) or (settle and settling(after_first) and clock() < until):
            prep()
            t0 = clock()
            step()
            t += clock() - t0
            if run == 0 and first_ms is not None:
                first_ms.append((clock() - t0) * 1e3)
            elif run > 0:
                after_first.append((clock() - t0) * 1e3)
            run += 1
        launch_ms.append(t * 1e3 / run)
    return launch_ms


# The least time per sampler before interleaved rounds may stop as decided: their interval
# assumes independent rounds, and the rounds of a short step taken within one disturbance of
# the machine (a scheduler tick, a clock change, another process's burst) all agree on it.
DECIDE_AFTER_S = 0.05


def interleave(
    samplers: Sequence[Callable[[], float]],
    clock: Clock,
    *,
    min_rounds: int = 5,
    max_rounds: int = 200,
    budget_s: float = 1.0,
    decided: Callable[[list[list[float]]], bool] | None = None,
    decide_after_s: float = 0.0,
) -> list[list[float]]:
    """Rounds of one sample from each sampler, in rotating order (A B C, B C A, C A B, ...), until
    `max_rounds`, or `min_rounds` once `budget_s` per sampler is spent, or, from `min_rounds`
    on and `decide_after_s` per sampler, the first round after which `decided(samples)` holds:
    the question the rounds answer is decided, and more of them would only narrow an interval
    nobody reads (a rule looked at after every round must be stricter than one looked at once:
    `stats.STRICT_Z`). A sampler may take its sample in another process (finalists that must not
    share one: `cudnn.benchmark`). Each takes every place in turn, and with three or more none
    follows itself: in one process, a sample right after its own would find its memory warm."""
    n = len(samplers)
    samples: list[list[float]] = [[] for _ in samplers]
    start = clock()
    rounds = 0
    while rounds < max_rounds:
        for i in [(rounds + k) % n for k in range(n)]:
            samples[i].append(samplers[i]())
        rounds += 1
        spent = clock() - start
        if rounds >= min_rounds and spent >= budget_s * n:
            break
        if rounds >= min_rounds and spent >= decide_after_s * n and decided and decided(samples):
            break
    return samples


def measure(
    fn: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy = TimingPolicy(),
    *,
    clock: Clock | None = None,
    flush: Callable[[], None] | None = None,
    queue_ahead: bool = False,
    race: Race | None = None,
    deadline: float | None = None,
    after_first: Callable[[], None] | None = None,
    resume: Measurement | None = None,
    settle: bool = True,
) -> Measurement:
    """Time `fn` (one step). `clock` replaces the timer (tests); `flush` runs outside each sample;
    `queue_ahead` times device work only (see `Sampler`); `race` stops sampling a candidate that
    cannot win; `deadline` (on `clock`) stops sampling when the run's time budget is spent, and
    a raced candidate whose first call ran past it gets no samples at all; `after_first` runs
    once the first call (its one-off costs: compilation, autotuning, cuDNN's benchmark search)
    is done. `resume` is this step's screen (`Race.screen`), taken on the same built candidate:
    its first call and warm-up are not run again, one call re-warms it (other candidates ran
    since), and the samples start afresh (a screen's early samples can sit above the steady
    state: they stay the screen's). `settle`: on a CPU the warm-up goes on until the step has
    settled (`settling`); False where the process has settled one in its layout
    (`settle.settles`): the policy's runs."""
    with device_guard(device):
        sampler = Sampler(device, clock, flush, queue_ahead)
        if resume is not None:
            return _sample(fn, device, policy, sampler, race, deadline, *_rewarm(fn, device,
                                                                                sampler, resume))
        return _measure(fn, device, policy, sampler, race, deadline, after_first, settle)


def _rewarm(
    fn: Callable[[], object], device: torch.device, sampler: Sampler, screen: Measurement
) -> tuple[float | None, int, list[float], int]:
    """One warm-up call of a screened step resumed for its full timing: (its first call's
    time, its warm-up runs, this run's time on a CPU, its calls per sample)."""
    synchronize(device)
    t = sampler.clock()
    fn()
    run_ms = (sampler.clock() - t) * 1e3
    synchronize(device)
    sampler.launch_ms = run_ms
    warm_ms = [run_ms] if device.type != "cuda" else []
    return screen.first_call_ms, screen.warmup_runs + 1, warm_ms, screen.reps


def _measure(
    fn: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy,
    sampler: Sampler,
    race: Race | None = None,
    deadline: float | None = None,
    after_first: Callable[[], None] | None = None,
    settle: bool = True,
) -> Measurement:
    clock = sampler.clock
    synchronize(device)
    t0 = clock()
    fn()
    synchronize(device)
    first_ms = (clock() - t0) * 1e3
    if after_first is not None:
        after_first()
    if deadline is not None and race is not None and clock() >= deadline:
        # The first call holds lazy init, cuDNN's benchmark search, Triton's compile and
        # autotune: when that alone used up the budget, a raced candidate is not sampled. (One
        # without a race is a reference the run needs, the default or native: it still is.)
        return Measurement(samples_ms=[], first_call_ms=first_ms, stop="first_call")

    warm_start = clock()
    warm = 0
    launch_s = 0.0
    warm_ms: list[float] = []  # on a CPU, each warm-up run's own time (evidence for a race)
    # A warm-up asked for goes on until the step has settled, within a measurement's time (on a
    # CPU: a GPU's warm-up runs are its launches, its one-time costs its first call's)
    settle = settle and device.type != "cuda"
    settle_until = warm_start + max(policy.max_time_s, policy.warmup_s)
    # On a CPU a screen's runs stop at twice its drop line (over twice the steady state of any
    # candidate that could still win): past the policy's warm-up (whose runs may still pay
    # one-time costs), two such runs in a row decide it (`cut`); one run slowed by another
    # process does not.
    screened = race is not None and race.screen is not None and device.type != "cuda"
    cut_ms = 2 * race.limit_ms if screened else math.inf  # type: ignore[union-attr]
    over: list[float] = []  # its latest runs in a row past the cut (stopped there or ended past)
    past = False  # the last run: stopped at the cut or ended past it
    while (policy_run := warm < policy.warmup_runs or clock() - warm_start < policy.warmup_s) or (
        settle and warm > 0 and settling(warm_ms) and clock() < settle_until
    ) or past:
        run_s = _run(fn, cut_ms, clock)
        launch_s += run_s  # on a GPU: the host's time to enqueue the step
        if device.type != "cuda":
            warm_ms.append(run_s * 1e3)
        warm += 1
        past = run_s * 1e3 >= cut_ms
        over = [*over, warm_ms[-1]] if past and not policy_run else []
        if len(over) == 2:  # two of a screen's 3 samples above its line
            return Measurement(samples_ms=over, first_call_ms=first_ms, warmup_runs=warm - 2,
                               stop="cut", warmup_s=clock() - warm_start - sum(over) / 1e3,
                               sampling_s=sum(over) / 1e3)  # fmt: skip
        if warm >= 1000 or (deadline is not None and clock() >= deadline):
            break  # past the budget: one warm-up run is all it gets
    synchronize(device)
    warm_s = clock() - warm_start
    if warm:
        sampler.launch_ms = launch_s * 1e3 / warm
        reps = reps_for(warm_s * 1e3 / warm, policy)
    else:
        reps = reps_for(first_ms, policy)
    return _sample(fn, device, policy, sampler, race, deadline, first_ms, warm, warm_ms, reps,
                   warm_s)  # fmt: skip


def _run(fn: Callable[[], object], cut_ms: float, clock: Callable[[], float]) -> float:
    """One run of `fn`, stopped once it has run `cut_ms` (`stop_after`): its seconds, the run
    alone, without the allowance's set-up and end (a short step's run would otherwise read a
    tenth of a millisecond slow); a stopped run's are at least `cut_ms`."""
    bound = cut_ms / 1e3 if math.isfinite(cut_ms) else None
    with stop_after(bound, counting=False) as allowance:
        t = clock()
        try:
            allowance.start()
            fn()
            allowance.end()
        except Exception as e:
            if bound is None or not over_allowance(e):
                raise
        return clock() - t


def _sample(
    fn: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy,
    sampler: Sampler,
    race: Race | None,
    deadline: float | None,
    first_ms: float | None,
    warm: int,
    warm_ms: list[float],
    reps: int,
    warm_s: float | None = None,
) -> Measurement:
    """Samples of a warm step until the policy's rule, the race or the deadline stops them,
    taken in batches of about `BATCH_MS` (`Sampler.batch`), each sample judged in turn: a
    batch's samples after the one that stops it are not kept."""
    clock = sampler.clock
    samples: list[float] = []
    start = clock()
    stopped: Sampling | None = None
    done = False
    while not done:
        count = batch_size(samples, reps)
        for ms in sampler.batch(fn, reps, count):
            samples.append(ms)
            done, stopped = enough(samples, policy, race, warm_ms, deadline, clock, start)
            if done:
                break
    return Measurement(
        samples_ms=samples, first_call_ms=first_ms, warmup_runs=warm, reps=reps, stop=stopped,
        warmup_s=warm_s, sampling_s=clock() - start,
    )  # fmt: skip
