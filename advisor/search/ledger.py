"""The record of what a run measured: one ledger of entries, each keyed by its candidate's
settings, read by every stage, the pick, the report and the stored-advice reuse.

An entry is written once and never changed: a candidate's trial (the search's are optuna's own
trials, read as entries; a later stage's, such as a compile or a cudnn.benchmark twin, is an
entry of the study), a verdict given after its trial (its gate, asked for once the pick needed
it), each interleaved re-time round, the final check and a precision's verdict. What a reader
wants of a candidate, its *standing*, is derived from its entries by one function
(`Ledger.results`): its latest measurement (the run's latest re-time round it took part in, or
its trial), its latest verdict (or its precision's, for one that waits for it), the memory
limit. One-off costs (a cold compile, cuDNN's search) and a screen are measured inside the trial
and stay in its entry.

The entries live in the study's attributes under `ENTRY_PREFIX`; a study stores
`RECORD_FORMAT`, and one stored in an earlier format is refused with one line rather than read
differently from how it was written.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import optuna
from pydantic import BaseModel, ConfigDict, ValidationError

from advisor.config import FinalCheck
from advisor.errors import StorageError
from advisor.execute.gating import with_precision, with_verdict
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.verdict import PrecisionCheck, own_path

__all__ = ["ENTRY_PREFIX", "RECORD_FORMAT", "Entry", "Ledger", "check_format", "memory_checked"]

RECORD_FORMAT = 3
ENTRY_PREFIX = "entry:"
FORMAT_ATTR = "record_format"

EntryKind = Literal["trial", "verdict", "retime", "final_check", "precision"]
Stage = Literal["search", "cudnn.benchmark", "per-layer", "compile"]


class Entry(BaseModel):
    """One measurement of a candidate, or a verdict on one."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    kind: EntryKind
    key: str  # the candidate's settings (JSON); a precision verdict: its own path's
    seq: float  # when it was added (wall clock): the order across processes and runs
    run: str = ""  # the run that added it: re-time rounds count within their run
    round: int = 0  # a re-time's round within its run (1, 2, ...)
    stage: Stage = "search"  # a trial: the stage that measured it
    number: int = -1  # a search trial: optuna's trial number
    # a re-time or a final check the runs sharing the study take once: the candidates' key
    group: str = ""
    result: TrialResult | None = None  # trial, verdict, re-time: what was measured
    final: FinalCheck | None = None  # final check
    check: PrecisionCheck | None = None  # precision verdict

    def attr(self) -> str:
        """Its name among the study's attributes: unique, so no entry overwrites another."""
        digest = hashlib.sha256(f"{self.key}|{self.run}|{self.round}|{self.seq!r}".encode())
        return f"{ENTRY_PREFIX}{self.kind}:{digest.hexdigest()[:24]}"


def key_of(settings: Settings) -> str:
    return settings.model_dump_json()


def check_format(study: optuna.Study, name: str) -> None:
    """Refuse a study stored in another format than `RECORD_FORMAT` (one with no trials is new:
    the search marks it with its format, `FORMAT_ATTR`)."""
    stored = study.user_attrs.get(FORMAT_ATTR)
    if stored == RECORD_FORMAT or (stored is None and not study.get_trials(deepcopy=False)):
        return
    raise StorageError(
        f"study {name!r} was stored by an earlier version of the advisor (record format "
        f"{stored or 1}, this one reads {RECORD_FORMAT}): run again with --fresh to measure it "
        "anew, or name another study with --study-name"
    )


def memory_checked(result: TrialResult, limit: float | None, baseline: Settings) -> TrialResult:
    """Reject an accepted candidate whose peak memory is over `limit` (never the baseline)."""
    if limit is None or result.status != "ok" or (result.peak_memory_mb or 0.0) <= limit:
        return result
    if result.settings == baseline:
        return result
    return result.model_copy(
        update={
            "status": "rejected",
            "rejection": "memory",
            "pending": None,
            "reason": f"peak memory {result.peak_memory_mb:.1f} MB over the --max-memory limit of "
            f"{limit:g} MB",
        }
    )


def search_trials(study: optuna.Study) -> list[tuple[int, TrialResult]]:
    """Every candidate's search trial (the lowest-numbered evaluated one), by trial number."""
    out, seen = [], set()
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if "result" not in t.user_attrs:
            continue
        result = TrialResult.model_validate(t.user_attrs["result"])
        if (key := key_of(result.settings)) not in seen:
            seen.add(key)
            out.append((t.number, result))
    return out


def _out_of_time(e: Entry) -> bool:
    stop = e.result.stop if e.result is not None else None
    return stop is not None and stop.kind == "out_of_time"


class Ledger:
    """A run's record (see the module's docstring), backed by its study where it has one."""

    def __init__(
        self,
        study: optuna.Study | None,
        default: Settings,
        *,
        run: str = "",
        max_memory_mb: float | None = None,
        entries: Iterable[Entry] = (),
        storage: optuna.storages.BaseStorage | None = None,
    ) -> None:
        self.study, self.default, self.run, self.max_memory_mb = study, default, run, max_memory_mb
        self.storage = storage  # the study's, as opened: claims lock on it
        self._trials: list[Entry] = []  # the search's, from the study's trials
        self._added: list[Entry] = list(entries)  # everything else, in order
        self._view: list[TrialResult] | None = None
        self.reload()

    @classmethod
    def of(cls, results: Sequence[TrialResult], default: Settings) -> Ledger:
        """A ledger of `results` as the search's trials, numbered in order, no study."""
        entries = [
            Entry(kind="trial", key=key_of(r.settings), seq=float(i), number=i, result=r)
            for i, r in enumerate(results)
        ]
        return cls(None, default, entries=entries)

    # ---- reading -------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the study's trials and entries again (other processes may have added some)."""
        self._view = None
        if self.study is None:
            return
        self._trials = [
            Entry(kind="trial", key=key_of(r.settings), seq=-1.0, number=n, result=r)
            for n, r in search_trials(self.study)
        ]
        known = {e.attr() for e in self._added}
        for name, value in self.study.user_attrs.items():
            if name.startswith(ENTRY_PREFIX) and name not in known:
                try:
                    self._added.append(Entry.model_validate(value))
                except ValidationError:
                    continue  # another version's entry: this study's format says it is not
        self._added.sort(key=lambda e: e.seq)

    @property
    def entries(self) -> list[Entry]:
        return [*self._trials, *self._added]

    def of_kind(self, kind: EntryKind) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]

    def _trial_entries(self) -> list[Entry]:
        """The candidates' trials: the search's by number (a point measured twice by racing
        workers keeps its first), then the later stages' in the order they came, where one
        measured again (a payback judged for another horizon) stands by its latest."""
        out = {e.key: e for e in reversed(self._trials)}
        order = [e.key for e in self._trials]
        for e in self._added:
            if e.kind == "trial" and e.key not in order:
                order.append(e.key)
            if e.kind == "trial" and (e.key not in out or out[e.key].stage != "search"):
                out[e.key] = e
        return [out[k] for k in dict.fromkeys(order)]

    def rounds(self) -> int:
        """How many re-time rounds this run has taken."""
        return max(
            (e.round for e in self._added if e.kind == "retime" and e.run == self.run), default=0
        )

    def results(self) -> list[TrialResult]:
        """Every candidate's standing, in trial order (the same objects until an entry is
        added, so a reader may compare them by identity within one reading)."""
        if self._view is not None:
            return self._view
        latest = self.rounds()
        judged = {e.key: e.check for e in self.of_kind("precision") if e.check is not None}
        retimed: dict[str, Entry] = {}
        verdicts: dict[str, Entry] = {}
        for e in self._added:
            if e.kind == "retime" and e.run == self.run:
                retimed[e.key] = e  # the latest round the candidate took part in
            elif e.kind == "verdict" and (e.run == self.run or not _out_of_time(e)):
                verdicts[e.key] = e  # a check another run's budget cut is this run's to make
        out = []
        for e in self._trial_entries():
            assert e.result is not None
            r = e.result
            again = retimed.get(e.key)
            if again is not None and again.result is not None:
                r = again.result
                if again.round != latest:  # an earlier window's rounds: no longer paired
                    r = r.model_copy(update={"retimed": False})
            verdict = verdicts.get(e.key)
            if verdict is not None and verdict.result is not None and r.pending is not None:
                r = with_verdict(r, verdict.result)
            if r.pending == "precision" and (check := judged.get(key_of(own_path(r.settings)))):
                r = with_precision(r, check)  # judged since, on another candidate
            out.append(memory_checked(r, self.max_memory_mb, self.default))
        self._view = out
        return out

    def origins(self) -> list[tuple[int, Stage]]:
        """Each standing's optuna trial number (-1: measured by a later stage) and the stage
        that measured it."""
        return [(e.number, e.stage) for e in self._trial_entries()]

    def baseline(self) -> TrialResult | None:
        return next((r for r in self.results() if r.settings == self.default), None)

    def standing(self, settings: Settings) -> TrialResult | None:
        return next((r for r in self.results() if r.settings == settings), None)

    def checks(self) -> list[PrecisionCheck]:
        return [e.check for e in self.of_kind("precision") if e.check is not None]

    # ---- writing -------------------------------------------------------------------------

    def add(self, entry: Entry, keep: bool = True) -> Entry:
        """Append `entry`, and keep it in the study (`keep`: not where it is another run's
        measurement this run reads as its own)."""
        if keep and self.study is not None:
            self.study.set_user_attr(entry.attr(), entry.model_dump(mode="json"))
        self._added.append(entry)
        self._view = None
        return entry

    def _new(self, kind: EntryKind, key: str, keep: bool = True, **fields: Any) -> Entry:
        entry = Entry(kind=kind, key=key, seq=time.time(), run=self.run, **fields)
        return self.add(entry, keep)

    def shared(self, kind: EntryKind, group: str, size: int = 1) -> list[Entry]:
        """The latest whole re-time round (or final check) any run of the study took of `group`,
        an entry for each of its `size` candidates (a round is written an entry at a time): what
        a run sharing the study reads instead of measuring it again."""
        rounds: dict[tuple[str, int | None], list[Entry]] = {}
        for e in self._added:  # in seq order
            if e.kind == kind and e.group == group:
                rounds.setdefault((e.run, e.round), []).append(e)
        complete = [r for r in rounds.values() if len({e.key for e in r}) >= size]
        return max(complete, key=lambda r: r[-1].seq, default=[])

    def wait_shared(
        self, kind: EntryKind, group: str, timeout_s: float, poll_s: float = 0.5, size: int = 1
    ) -> list[Entry]:
        """`shared`, waiting up to `timeout_s` for the run that claimed it to write it whole."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.reload()
            got = self.shared(kind, group, size)
            if got or time.monotonic() >= deadline:
                return got
            time.sleep(poll_s)

    def trial(self, result: TrialResult, stage: Stage) -> None:
        """A candidate measured by a later stage (a compile, a cudnn.benchmark twin, a
        per-layer combination)."""
        self._new("trial", key_of(result.settings), stage=stage, result=result)

    def verdict(self, result: TrialResult) -> None:
        """A candidate's gate, given after its trial (`gating.gate_only`'s result)."""
        self._new("verdict", key_of(result.settings), result=result)

    def retime(self, results: Sequence[TrialResult], group: str = "", keep: bool = True) -> None:
        """A new interleaved re-time round of this run: only its finalists are paired now.
        `keep=False`: another run's round of the same finalists, read as this run's."""
        n = self.rounds() + 1
        for r in results:
            self._new("retime", key_of(r.settings), keep, round=n, result=r, group=group)

    def final_check(self, checked: Settings, final: FinalCheck, group: str = "") -> None:
        self._new("final_check", key_of(checked), final=final, group=group)

    def precision(self, check: PrecisionCheck) -> None:
        """A precision's verdict on this model (judged once: every later candidate reads it)."""
        if any(c.own_path == check.own_path for c in self.checks()):
            return
        self._new("precision", key_of(check.own_path), check=check)
