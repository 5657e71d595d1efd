"""A run as a plan of parts under one deadline, and the rows it appends to the table.

A part is one advise run (a model, mode and effort, from a tree) or one model's re-time (what
the advice is worth: benchmarks/retime.py, on the picks of that model's advise runs). The
deadline, where there is one, is shared by the parts in proportion to their planned seconds
(`share_s`, shares, not measurements): a part that ends early leaves its time to the next, one
that runs out is stopped (an advise run gets Ctrl-C first: an eager answer written stays) and
its row says so. A model's rows are appended once its last part ended, so a run cut short keeps
every model it finished.

`compare` builds its plan across revisions: each in a worktree of its own
(`git worktree add --detach`), their advise runs alternating model by model, the order reversed
with each repeat, so that a machine that slows down during the run favours none; with
`--worth`, the revisions' picks are re-timed together, in the same interleaved rounds.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import retime as retime_mod
from benchmarks.registry import ROOT, Model, UsageError
from benchmarks.runner import advise
from benchmarks.table import SCHEMA, TABLE, append, environment, git_state, machine_id, now

# Planned seconds of a part on a small CPU, by effort: shares of a deadline, not measurements.
# The zoo's six models in train mode at quick and default effort with their re-times plan
# 6 x 175 s, within the 1140 s its command gives (docs/development.md), so that what a part
# leaves flows to the later ones rather than every part getting less than its share.
SHARES = {"quick": 25.0, "default": 90.0, "full": 180.0, None: 90.0}
WORTH_SHARE = 60.0
NO_DEADLINE_S = 3600.0  # a part's limit where the run has no deadline


@dataclass(frozen=True)
class Part:
    kind: str  # "advise" or "worth"
    model: Model
    mode: str
    effort: str | None = None
    share_s: float = 60.0
    target_s: float | None = None  # the GPU command's wall-time target for an advise run
    tree: Path = ROOT
    revision: str | None = None  # compare: the revision this tree is at

    @property
    def name(self) -> str:
        what = (self.effort or "advise") if self.kind == "advise" else "worth"
        at = f" @ {self.revision}" if self.revision else ""
        return f"{self.model.name} {self.mode} {what}{at}"


@dataclass
class Options:
    device: str = "cpu"
    command: str = "python -m benchmarks"
    deadline_s: float | None = None
    round_s: float = 1.0
    roles: tuple[str, ...] = ("default", "pick", "hand", "compile")
    table: Path = TABLE
    extra: tuple[str, ...] = ()  # advise's own options (--space, --in-process, --budget)
    commit: str | None = None  # given where there is no git (the device machine)
    samples: Path | None = None  # raw samples and configs kept here, outside the tree
    keep_work: Path | None = None  # a .tgz of the advise runs' configs and trials files
    profile: Path | None = None  # a folder for each advise run's cProfile output
    env: dict[str, str] = field(default_factory=dict)  # for the advise runs (fresh caches)
    judge: Callable[[dict[str, Any]], Any] | None = None  # a row's targets (the GPU command)
    # Fresh advisor, Inductor and Triton caches for the advise runs, as on a new user's machine:
    # one folder for the command ("command": what one run leaves, the next reads), or one for
    # each run ("run": compare's revisions on an equal footing). `env` can name others.
    caches: str = "command"


def limit_for(left_s: float, share_s: float, later_s: float) -> float:
    """A part's time: what is left less the later parts' shares where that is more than its own
    share (the parts before ended early), else its share of what is left (they ran late)."""
    return max(left_s - later_s, left_s * share_s / (share_s + later_s), 0.0)


def plan_for(models: list[Model], modes: list[str] | None, efforts: list[str | None],
             worth: bool, device: str) -> list[Part]:  # fmt: skip
    """Each model in each of its modes (those asked for): its advise runs, then its re-time."""
    parts: list[Part] = []
    for m in models:
        for mode in [x for x in m.modes if not modes or x in modes]:
            parts += [Part("advise", m, mode, e, SHARES[e]) for e in efforts]
            if worth:
                parts.append(Part("worth", m, mode, None, WORTH_SHARE))
    if not parts:
        raise UsageError("nothing to run: no model has the modes asked for")
    return parts


def _roles(opts: Options, runs: list[tuple[Part, dict[str, Any]]], bf16: bool) -> dict[str, Any]:
    roles: dict[str, dict[str, Any]] = {}
    if "default" in opts.roles:
        roles["default"] = {}
    if "pick" in opts.roles:
        for part, run in runs:
            if run.get("settings"):
                roles[pick_role(part)] = run["settings"]
    if "hand" in opts.roles:
        roles["hand"] = retime_mod.hand_setting(opts.device, bf16)
    if "compile" in opts.roles:
        roles["compile"] = retime_mod.COMPILE
    return roles


def pick_role(part: Part) -> str:
    """'pick quick'; in a comparison 'pick 1a2b3c4d5e quick'."""
    return " ".join(["pick", *(x for x in (part.revision, part.effort) if x)])


def run_plan(plan: list[Part], opts: Options, log: Callable[[str], None] = print
             ) -> list[dict[str, Any]]:  # fmt: skip
    """Every part of `plan`, in order, within `opts.deadline_s`; the rows appended to
    `opts.table` model by model, and returned."""
    from advisor.measure.machine_load import CpuUsage

    start = time.perf_counter()
    env = environment(opts.device)
    machine = machine_id(env)
    states: dict[Path, tuple[str | None, bool | None]] = {}
    log(f"[benchmarks] {machine} | torch {env.get('torch')} | {len(plan)} parts"
        + (f" | deadline {opts.deadline_s:.0f} s" if opts.deadline_s else ""))  # fmt: skip
    # Why each model cannot be built here, once: a model that is skipped plans no time
    missing = {p.model.name: p.model.missing() for p in plan}
    rows: list[dict[str, Any]] = []
    done: dict[tuple[str, str], list[tuple[Part, dict[str, Any]]]] = {}
    worths: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="benchmarks-") as tmp:
        work = Path(tmp)
        for i, part in enumerate(plan):
            key = (part.model.name, part.mode)
            if opts.deadline_s is None:
                limit = NO_DEADLINE_S
            else:
                left = opts.deadline_s - (time.perf_counter() - start)
                later = sum(p.share_s for p in plan[i + 1:] if not missing[p.model.name])
                limit = limit_for(left, part.share_s, later)
            why = missing[part.model.name]
            if part.kind == "advise":
                if why or limit < 5:
                    run: dict[str, Any] = {"status": f"skipped: {why}" if why
                                           else "not run: the deadline"}  # fmt: skip
                    log(f"[benchmarks] {part.name}: {run['status']}")
                else:
                    log(f"[benchmarks] {part.name}: advise, {limit:.0f} s at most")
                    usage = CpuUsage()
                    fresh = work / "caches" / (f"run{i}" if opts.caches == "run" else "all")
                    extra_env = {**child_caches(fresh), **opts.env}
                    if opts.profile is not None:
                        extra_env["ADVISOR_PROFILE_DIR"] = str(opts.profile / _slug(part))
                    run = advise(part.model, part.mode, part.effort, opts.device, limit_s=limit,
                                 work=work, tree=part.tree, extra=opts.extra, env=extra_env,
                                 log=log)  # fmt: skip
                    run["other_cpu_share"] = usage.others_share()
                    if opts.profile is not None:
                        run["profile"] = _slug(part)
                run["limit_s"] = round(limit, 1)
                done.setdefault(key, []).append((part, run))
            else:
                runs = [(p, r) for p, r in done.get(key, []) if r.get("config")]
                if why or not runs or limit < 5:
                    worths[key] = {"error": f"skipped: {why}" if why else
                                   "no advise run wrote a config" if not runs else
                                   "not run: the deadline"}  # fmt: skip
                    log(f"[benchmarks] {part.name}: {worths[key]['error']}")
                else:
                    log(f"[benchmarks] {part.name}: re-time, {limit:.0f} s at most")
                    usage = CpuUsage()
                    t0 = time.perf_counter()
                    res = retime_mod.retime(Path(runs[0][1]["config"]),
                                            _roles(opts, runs, bool(env.get("bf16_units"))),
                                            part.mode, opts.device, t0 + limit, opts.round_s,
                                            log)  # fmt: skip
                    worths[key] = {**retime_mod.figures(res, opts.device, opts.samples is not None),
                                   "round_s": opts.round_s, "seconds": round(
                                       time.perf_counter() - t0, 1), "limit_s": round(limit, 1),
                                   "other_cpu_share": usage.others_share()}  # fmt: skip
            if opts.keep_work is not None:
                _keep(work, opts.keep_work)  # the files in `work`, not the caches' folders
            if all((p.model.name, p.mode) != key for p in plan[i + 1:]):  # the model's last part
                new = [_row(p, r, worths.get(key), env, machine, opts, states)
                       for p, r in done.get(key, [])]  # fmt: skip
                if opts.samples is not None:
                    _keep_samples(done.get(key, []), opts.samples)
                append(new, opts.table)
                rows += new
    log(f"[benchmarks] {len(rows)} rows appended to {opts.table} "
        f"({time.perf_counter() - start:.0f} s)")  # fmt: skip
    return rows


def _slug(part: Part) -> str:
    return f"{part.model.name}_{part.mode}_{part.effort or 'default'}" + (
        f"_{part.revision}" if part.revision else "")


# The advise run's fields that go into its row (the rest: its output tail, its temporary config)
_RUN_FIELDS = ("status", "advise_command", "wall_s", "eager_s", "exit_code", "stopped_s",
               "limit_s", "other_cpu_share", "profile", "settings", "pick", "claimed_speedup",
               "claimed_ci", "why", "final_check", "stage_s", "harness_share",
               "harness_share_gate_apart", "tuning_s", "other_load", "answer", "trials",
               "rejected", "notes", "compile_note")  # fmt: skip


def _row(part: Part, run: dict[str, Any], worth: dict[str, Any] | None, env: dict[str, Any],
         machine: str, opts: Options, states: dict[Path, Any]) -> dict[str, Any]:  # fmt: skip
    if part.tree not in states:
        states[part.tree] = git_state(part.tree)
    commit, dirty = states[part.tree]
    if opts.commit:  # the device machine's copy has no git: the caller says
        commit, dirty = opts.commit, None
    row: dict[str, Any] = {
        "schema": SCHEMA, "machine": machine, "commit": commit, "dirty": dirty,
        "model": part.model.name, "mode": part.mode,
        "effort": run.get("effort_run") or part.effort or "default",
        "date": now(), "device": opts.device, "command": opts.command, "env": env,
        "target_s": part.target_s,
    }  # fmt: skip
    row.update({k: run[k] for k in _RUN_FIELDS if k in run})
    if part.revision:
        row["revision"] = part.revision
    if worth is not None:
        row["worth"] = {**worth, "pick_role": pick_role(part)} if "error" not in worth else worth
    row["source"] = None
    if opts.judge is not None:
        row["targets"] = opts.judge(row)
    return row


def _keep(work: Path, tgz: Path) -> None:
    """The advise runs' configs and trials files (where the time went, trial by trial)."""
    tgz.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz, "w:gz") as tar:
        for f in sorted(work.glob("*")):
            if f.is_file():
                tar.add(f, arcname=f.name)


def _keep_samples(runs: list[tuple[Part, dict[str, Any]]], into: Path) -> None:
    """--samples: each run's config and trials table, beside the rows that keep their samples."""
    into.mkdir(parents=True, exist_ok=True)
    for _, run in runs:
        if not run.get("config"):
            continue  # a run that wrote none (a model that cannot be built here)
        cfg = Path(run["config"])
        for f in (cfg, cfg.with_suffix(".trials.csv"), cfg.with_suffix(".layers.csv")):
            if f.is_file():
                shutil.copy(f, into / f.name)


# ======================================================================== compare's worktrees


def resolve(rev: str) -> str:
    """A revision's short commit; UsageError where git does not know it."""
    r = subprocess.run(["git", "rev-parse", "--short=10", "--verify", "--quiet", f"{rev}^{{commit}}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=30)  # fmt: skip
    if r.returncode != 0 or not r.stdout.strip():
        raise UsageError(f"unknown revision {rev!r} (git rev-parse found no commit)")
    return r.stdout.strip()


@contextlib.contextmanager
def worktrees(revs: list[str]) -> Any:
    """A detached worktree of each revision (its own code, this Python and its packages),
    removed afterwards however the run ends: {sha: path}."""
    shas = list(dict.fromkeys(resolve(r) for r in revs))
    if len(shas) < 2:
        raise UsageError("compare needs two revisions or more (distinct commits)")
    tmp = Path(tempfile.mkdtemp(prefix="benchmarks-compare-"))
    trees: dict[str, Path] = {}
    try:
        for sha in shas:
            path = tmp / sha
            r = subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
            if r.returncode != 0:
                raise UsageError(f"git worktree add {sha} failed: "
                                 f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")  # fmt: skip
            trees[sha] = path
        yield trees
    finally:
        for path in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                           capture_output=True, timeout=300)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)


def compare_plan(trees: dict[str, Path], models: list[Model], modes: list[str] | None,
                 efforts: list[str | None], repeats: int, worth: bool) -> list[Part]:  # fmt: skip
    """Each model's advise runs at every revision, alternating: revision order reversed at
    every turn; with `worth`, then one re-time of the model for all the revisions' picks."""
    parts: list[Part] = []
    turn = 0
    revs = list(trees.items())
    for m in models:
        for mode in [x for x in m.modes if not modes or x in modes]:
            for _ in range(repeats):
                for effort in efforts:
                    order = revs if turn % 2 == 0 else revs[::-1]
                    turn += 1
                    parts += [Part("advise", m, mode, effort, SHARES[effort], tree=tree,
                                   revision=sha) for sha, tree in order]  # fmt: skip
            if worth:
                parts.append(Part("worth", m, mode, None, WORTH_SHARE))
    if not parts:
        raise UsageError("nothing to run: no model has the modes asked for")
    return parts


def child_caches(work: Path) -> dict[str, str]:
    """Fresh caches for the advise runs of one command, as on a new user's machine: nothing
    reused from an earlier command; what one run leaves, the next reads."""
    return {var: str(work / sub) for var, sub in (("ADVISOR_CACHE_DIR", "advisor"),
            ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"))}  # fmt: skip

