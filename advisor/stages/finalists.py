"""Re-timing the finalists: the best candidates so far timed together, interleaved, so that the
pick compares measurements from one time window; and whether the machine held still meanwhile.

What a re-time or the final check measured is shared with the other runs of a stored study
(`taken_once`), so that runs that share a study agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections.abc import Sequence

import torch

from advisor.errors import first_line
from advisor.execute.evaluators import Evaluator
from advisor.execute.ownership import owner_id
from advisor.measure.machine_load import BUSY_SHARE
from advisor.measure.results import TrialResult
from advisor.search.ledger import Entry, EntryKind
from advisor.search.options import SearchOptions, SearchOutcome
from advisor.search.pick import Pick
from advisor.search.run import make_evaluator
from advisor.search.storage import Claims
from advisor.space import SearchSpace
from advisor.workload.build import Workload

__all__ = ["after_compile", "group_of", "machine_moved", "retime_finalists", "taken_once"]

log = logging.getLogger("advisor")


def retime_finalists(
    workload: Workload,
    outcome: SearchOutcome,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    only_with: Sequence[TrialResult] | None = None,
    deadline: float | None = None,
    evaluator: Evaluator | None = None,
    among: Sequence[TrialResult] | None = None,
) -> tuple[int, str | None]:
    """Re-time the finalists interleaved and put the fresh measurements in the outcome.

    With `only_with`, re-time only if one of those candidates is among the finalists; with
    `among`, the finalists are drawn from those results (and the baseline) only. Returns how
    many were re-timed (0 when skipped: fewer than two finalists) and, when the re-time failed,
    why.
    """
    top = space.retime_top
    pool = outcome.results if among is None else among
    fin = space.contest(options.steps).finalists(pool, outcome.baseline, top) if top else []
    wanted = [w.settings for w in only_with] if only_with is not None else None
    if len(fin) < 2 or (wanted is not None and not any(r.settings in wanted for r in fin)):
        return 0, None
    left = None if deadline is None else max(0.0, deadline - time.perf_counter())
    # Another run of this study that re-times these finalists: its round is this run's, so
    # both agree.
    group = group_of(fin)
    taken = taken_once(outcome, options, "retime", group, len(fin))
    if taken:
        outcome.ledger.retime([e.result for e in taken if e.result is not None], group, keep=False)
        return len(fin), None
    # Like the trials, in a worker subprocess unless the user asked for in-process trials.
    ev = evaluator or make_evaluator(workload, device, space, options)
    try:
        fresh = ev.retime(fin, time_left_s=left)
    except (torch.OutOfMemoryError, RuntimeError) as e:  # e.g. finalists too big together
        why = first_line(e, with_type=False)
        log.warning("interleaved re-time failed: %s", why)
        return 0, why
    finally:
        if ev is not evaluator:
            ev.close()
    # A new round: only its finalists compete in the pick now, an earlier round's samples were
    # taken in another time window
    outcome.ledger.retime(fresh, group)
    return len(fin), None


def after_compile(eager: Pick, compiled: Sequence[TrialResult]) -> list[TrialResult]:
    """What the re-time after the compile stage draws its finalists from (with the default):
    the `compiled` candidates, the eager answer `eager` and its fastest candidate (a compile's
    bill alternative). The eager candidates the eager re-time ranked below its pick are decided
    and not timed again."""
    return list({r.settings.model_dump_json(): r
                 for r in (*compiled, eager.chosen, eager.fastest)}.values())


def group_of(results: Sequence[TrialResult]) -> str:
    """The key of a set of candidates, whatever their order."""
    return hashlib.sha256(
        json.dumps(sorted(r.settings.model_dump_json() for r in results)).encode()
    ).hexdigest()[:16]


def taken_once(
    outcome: SearchOutcome, options: SearchOptions, kind: EntryKind, group: str, size: int = 1
) -> list[Entry]:
    """What another run sharing the study measured of `group` (a re-time of its `size`
    candidates, a final check), or what the run that claimed it writes within a trial's time
    limit per candidate; [] where this run is to measure it (its claim, or the other's did not
    come in time; an in-memory study shares nothing)."""
    ledger = outcome.ledger
    if options.storage == "memory" or ledger.study is None or ledger.storage is None:
        return []
    ledger.reload()
    got = ledger.shared(kind, group, size)
    if not got and not Claims(ledger.study, ledger.storage).claim(f"{kind}:{group}", owner_id()):
        got = ledger.wait_shared(kind, group, options.trial_timeout_s * size, size=size)
    return got


def machine_moved(
    trial: TrialResult,
    retimed: TrialResult,
    others_share: float | None,
    factor: float = 2.0,
) -> str | None:
    """Why the measurements cannot be trusted: the machine moved under them, as measured. None
    when it held still (or PyTorch's default was not re-timed).

    Two signs, both of PyTorch's default: it drifted by more than `factor` across the re-time's
    own interleaved rounds (the median of its first half of rounds against its last half: a
    clock that throttled, load that came or went), or it moved by more than `factor` between
    its trial and the re-time while other processes took more than `BUSY_SHARE` of the CPU
    (`others_share`, `machine_load.CpuUsage`). A trial slower than its re-time on a quiet
    machine, with steady rounds, is not the machine moving: that trial was the first
    measurement of its workload in the process (a cold trial can run several times its re-time),
    and the rounds, which time the finalists in one window, decide. Where the kernel's CPU count cannot be read, nothing says the machine was
    quiet, and a move between the trial and the re-time counts."""
    if not retimed.retimed or retimed.measurement is None:
        return None
    rounds = retimed.measurement.samples_ms  # in round order
    half = len(rounds) // 2
    if half >= 2:
        early, late = statistics.median(rounds[:half]), statistics.median(rounds[-half:])
        if early > 0 and late > 0 and max(early / late, late / early) > factor:
            return (
                f"the machine was not steady: PyTorch's default went from {early:.3f} ms to "
                f"{late:.3f} ms across the re-time's interleaved rounds "
                f"({max(early / late, late / early):.1f}x)"
            )
    if trial.measurement is None:
        return None
    before, after = trial.measurement.median_ms, retimed.measurement.median_ms
    if before <= 0 or after <= 0 or max(before / after, after / before) <= factor:
        return None
    if others_share is not None and others_share <= BUSY_SHARE:
        return None  # a quiet machine: a cold trial, which the re-time's rounds replace
    load = ""
    if others_share is not None:
        load = f" while other processes used {others_share:.0%} of the CPU"
    return (
        f"the machine was not steady: PyTorch's default measured {before:.3f} ms in its trial "
        f"and {after:.3f} ms when re-timed ({max(before / after, after / before):.1f}x apart)"
        f"{load}"
    )
