"""Whether a compiled candidate's cold compile can still pay back, judged before the gate's check.

A compiled candidate is recommended only when its cold compile pays back within the horizon
(`advisor.search.compile_bill`) against the eager settings the user would run instead. Its trial
knows the cold compile once the first call returns; its saving per step is what the bill needs,
and a saving taken across time windows is not one: the eager rival was timed seconds to minutes
earlier, and the same step can drift by tens of per cent between windows of one run.

So, after its samples and before the gate's capture (which, on a model with dropout, compiles
the model a second time: a large share of a compile trial), the compiled candidate
is timed beside its rival in the same process, interleaved (A B, B A, ...). Where even the most
favourable ends of the two intervals (the rival's high, the compiled one's low) cannot pay the
cold compile back within the horizon, the candidate is stopped: it cannot be recommended, so
neither the capture nor a re-time is spent on it. Otherwise it goes on to the gate (under a
race, where that capture compiles again, only once the pick needs its verdict:
`advisor.search.pick_gates`), and the pick's own bill is made later from the re-time, as for
any compiled finalist.
"""

from __future__ import annotations

from functools import partial

import torch

from advisor.execute.retime import prepare_flags, rounds
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate, Mode
from advisor.measure.contest import Contest
from advisor.measure.stats import Measurement, Race
from advisor.measure.stop import Stop
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import Sampler, interleave, warm_up
from advisor.workload.build import Workload

__all__ = ["cannot_pay"]


def cannot_pay(
    compiled: Candidate,
    trial: Measurement,
    race: Race | None,
    *,
    workload: Workload,
    device: torch.device,
    mode: Mode,
    seed: int,
    case: int,
    policy: TimingPolicy,
    pristine: dict[str, object],
    cold_s: float | None = None,
) -> tuple[Stop | None, list[Measurement] | None]:
    """Why the live candidate `compiled` stops before the gate's capture (`Contest.payback`),
    or None (an eager candidate, a race without a rival, a trial the race or the budget already
    stopped), and the rounds' measurements, its and the rival's (None: no rounds ran). Its cold
    compile is the trial's first call (`trial`), or `cold_s` where its first call read a graph
    another candidate's cold compile made (`execute.runner`); the rival (`race.rival`) is built
    beside it and timed with it in rounds of the trial's policy (a decided bill stops them
    early). `pristine` is PyTorch's state before either was built; its flags are set again on
    return."""
    if race is None or race.rival is None or race.horizon_steps is None:
        return None, None
    if not compiled.tuned.settings.compiled or trial.stop is not None or not trial.samples_ms:
        return None, None
    contest = Contest(steps=race.horizon_steps)  # the payback rule reads its horizon
    rival = Settings.model_validate_json(race.rival)
    other = Candidate(workload, rival, device, mode, seed, case=case)
    try:
        sampler = Sampler(device)
        cands = [compiled, other]
        before = [partial(prepare_flags, pristine, c.tuned) for c in cands]
        first_ms: list[float] = []
        warm_up([c.step for c in cands], before, policy.warmup_runs, sampler.clock, first_ms)

        def one(i: int) -> float:
            before[i]()
            return sampler(cands[i].step, trial.reps)

        if cold_s is None:
            cold_s = (trial.first_call_ms or 0.0) / 1e3
        overhead_s = max(0.0, cold_s - first_ms[1] / 1e3)
        samples = interleave([partial(one, 0), partial(one, 1)], sampler.clock,
                             **rounds(policy),
                             decided=partial(contest.payback_decided, overhead_s))  # fmt: skip
    finally:
        other.close()
        prepare_flags(pristine, compiled.tuned)
    taken = [Measurement(samples_ms=s, reps=trial.reps) for s in samples]
    return contest.payback(taken[0], taken[1], cold_s, first_ms[1] / 1e3, rival.label()), taken
