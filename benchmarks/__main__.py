"""`python -m benchmarks <command>`: what a run costs and what the advice is worth, as data.

    python -m benchmarks list                         # the models and their sets
    python -m benchmarks advise --set zoo --efforts quick default --modes train
    python -m benchmarks worth --set zoo --efforts quick default --modes train
    python -m benchmarks compare HEAD~5 HEAD --models small_cnn --efforts quick --repeats 2
    python -m benchmarks gpu --out-dir $OUT --commit <sha>     # on a lent H100/H200
    python -m benchmarks gates verdicts relu_bn_block --seeds 3
    python -m benchmarks profile DIR                  # tables of $ADVISOR_PROFILE_DIR
    python -m benchmarks page                         # the generated pages and README block
    python -m benchmarks merge OUT/runs.jsonl         # a device run's rows into the table

`advise` runs `advisor advise` as a user types it, timed end to end (benchmarks/runner.py);
`worth` also re-times each model's picks against PyTorch's default, the hand setting and
`torch.compile` in fresh processes (benchmarks/retime.py). Every run appends its rows to
`benchmarks/results/runs.jsonl` (benchmarks/table.py); `page` regenerates the pages from it.
Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from benchmarks.registry import SETS, UsageError

EFFORTS = ["quick", "default", "full"]


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (not the usage and the error) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {text!r}")
    return int(text)


def _models(ap: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        ap.add_argument("models", nargs="*", metavar="MODEL",
                        help="registry names, globs ('tv_*') or model files")  # fmt: skip
    ap.add_argument("--set", dest="sets", nargs="+", choices=list(SETS), metavar="SET",
                    help=f"named sets of models: {', '.join(SETS)}")  # fmt: skip
    ap.add_argument("--modes", nargs="+", choices=["train", "infer"],
                    help="of each model's modes, these (default: all it has)")  # fmt: skip
    ap.add_argument("--efforts", nargs="+", choices=EFFORTS, default=None,
                    help="advise's --effort, one run each (default: default)")  # fmt: skip
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--deadline-s", type=_positive,
                    help="every part ends by then, the time shared in proportion (default: "
                    "none; each advise run at most an hour)")  # fmt: skip
    ap.add_argument("--table", type=Path, help="the table to append to (default: the committed "
                    "benchmarks/results/runs.jsonl)")  # fmt: skip
    ap.add_argument("--samples", type=Path, metavar="DIR", help="keep the raw samples in the "
                    "rows and each run's config and trials table in DIR (outside the tree)")  # fmt: skip
    ap.add_argument("--space", help="advise's --space")
    ap.add_argument("--budget", help="advise's --budget (e.g. 2m)")
    ap.add_argument("--in-process", action="store_true", help="advise's --in-process")


def _worth(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--roles", nargs="+", choices=["default", "pick", "hand", "compile"],
                    default=["default", "pick", "hand", "compile"],
                    help="what the re-time runs (default: all)")  # fmt: skip
    ap.add_argument("--round-s", type=_positive, default=1.0,
                    help="re-time: seconds of interleaved rounds per setting (default 1)")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="benchmarks", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")
    sub.add_parser("list", help="the models and their sets")
    _models(sub.add_parser("advise", help="what a run costs: advise runs, timed"))
    w = sub.add_parser("worth", help="advise runs, then each model's picks re-timed")
    _models(w)
    _worth(w)
    c = sub.add_parser("compare", help="the same figures for several revisions, alternating")
    c.add_argument("revisions", nargs="+", metavar="REV", help="git revisions (two or more), "
                   "then the models (registry names or files) after --models or --set")  # fmt: skip
    c.add_argument("--models", nargs="+", metavar="MODEL", help="registry names or model files")
    _models(c, positional=False)
    c.set_defaults(efforts=None)
    for action in c._actions:  # a revision from before effort levels takes no --effort
        if action.dest == "efforts":
            action.choices = [*EFFORTS, "none"]
            action.help = "advise's --effort, one run each; 'none' leaves the flag out"
    _worth(c)
    c.add_argument("--repeats", type=_count, default=1, help="advise runs per revision")
    c.add_argument("--worth", action="store_true",
                   help="then re-time the revisions' picks together (with this tree's harness)")  # fmt: skip
    from benchmarks import gpu

    gpu.add_arguments(sub.add_parser("gpu", help="the GPU command (benchmarks/gpu.py)"))
    g = sub.add_parser("gates", help="the numeric gate's studies", add_help=False)
    g.add_argument("study", choices=["verdicts", "noise", "check-cost", "held-out"])
    g.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("profile", help="tables of the profiles in $ADVISOR_PROFILE_DIR")
    p.add_argument("folder", type=Path)
    p.add_argument("--top", type=_count, default=15)
    p.add_argument("--out", type=Path)
    pg = sub.add_parser("page", help="regenerate the pages and the README block")
    pg.add_argument("--check", action="store_true", help="only say whether they are current")
    pg.add_argument("--table", type=Path)
    m = sub.add_parser("merge", help="append another table's rows (a device run's)")
    m.add_argument("files", nargs="+", type=Path)
    m.add_argument("--table", type=Path)
    return ap


def _advise_extra(args: argparse.Namespace) -> tuple[str, ...]:
    extra: list[str] = []
    if args.space:
        extra += ["--space", args.space]
    if args.budget:
        extra += ["--budget", args.budget]
    if args.in_process:
        extra.append("--in-process")
    return tuple(extra)


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    command = "python -m benchmarks " + shlex.join(argv)
    if args.cmd == "list":
        from benchmarks.registry import BY_NAME

        for name, members in SETS.items():
            print(f"{name}: {', '.join(members)}")
        print()
        for m in BY_NAME.values():
            print(f"{m.name:24} {'/'.join(m.modes):12} {m.what}")
        return 0
    if args.cmd in ("advise", "worth", "compare"):
        from benchmarks import plan
        from benchmarks.registry import select
        from benchmarks.table import TABLE

        models = select(args.models, args.sets)
        efforts: list[str | None] = [None if e == "none" else e for e in args.efforts or ["default"]]
        opts = plan.Options(device=args.device, command=command, deadline_s=args.deadline_s,
                            table=args.table or TABLE, extra=_advise_extra(args),
                            samples=args.samples)  # fmt: skip
        if args.cmd != "advise":
            opts.roles, opts.round_s = tuple(args.roles), args.round_s
        if args.cmd == "compare":
            opts.caches = "run"
            with plan.worktrees(args.revisions) as trees:
                parts = plan.compare_plan(trees, models, args.modes, efforts, args.repeats,
                                          args.worth)  # fmt: skip
                rows = plan.run_plan(parts, opts)
        else:
            rows = plan.run_plan(plan.plan_for(models, args.modes, efforts, args.cmd == "worth",
                                               args.device), opts)  # fmt: skip
        from benchmarks.pages import summary

        print(summary(rows))
        return 0
    if args.cmd == "gpu":
        from benchmarks import gpu

        return gpu.main(args, command)
    if args.cmd == "gates":
        from benchmarks import studies

        return studies.gates(args.study, args.rest)
    if args.cmd == "profile":
        from benchmarks import studies

        if not args.folder.is_dir():
            raise UsageError(f"not a folder: {args.folder}")
        text = studies.summary(args.folder, args.top)
        if args.out:
            args.out.write_text(text)
        else:
            print(text, end="")
        return 0
    if args.cmd == "page":
        from benchmarks import pages

        return pages.main(args.table, check=args.check)
    if args.cmd == "merge":
        from benchmarks import table

        rows = []
        for f in args.files:
            if not f.is_file():
                raise UsageError(f"not a file: {f}")
            rows += table.read(f)
        from benchmarks.pages import known_commit

        # a device run's copy has no git: its commit was typed in (--commit), so check it here
        for r in rows:
            if r.get("commit") and not known_commit(r["commit"]):
                raise UsageError(f"a row names commit {r['commit']}, which this repository does "
                                 "not have: was --commit typed right?")  # fmt: skip
        target = args.table or table.TABLE
        known = {tuple(r.get(k) for k in (*table.KEY, "date")) for r in table.read(target)}
        new = [r for r in rows if tuple(r.get(k) for k in (*table.KEY, "date")) not in known]
        table.append(new, target)
        print(f"{len(new)} rows appended to {target} ({len(rows) - len(new)} already there)")
        return 0
    raise AssertionError(args.cmd)


def main() -> int:
    try:
        return run(sys.argv[1:])
    except UsageError as e:
        print(f"benchmarks: {e}" if not str(e).startswith("benchmarks") else str(e),
              file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print("benchmarks: interrupted (the rows of the models already done are in the table)",
              file=sys.stderr)  # fmt: skip
        return 130


if __name__ == "__main__":
    sys.exit(main())
