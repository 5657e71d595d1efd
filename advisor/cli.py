"""The `advisor` command. Thin: each subcommand parses options and calls the public API.

Any AdvisorError (bad input) is printed as one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from advisor.cli_args import (
    GROUPS,
    add_groups,
    add_search_args,
    add_workload_args,
    check_workload_args,
    duration_s,
    search_kwargs,
    tolerance_overrides,
    workload_kwargs,
)
from advisor.errors import AdvisorError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="advisor",
        description="Measured tuning of PyTorch convolution settings.",
        epilog="`advisor advise --help` lists its options by purpose: "
        + ", ".join(GROUPS)
        + "; each says its default.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "advise",
        help="tune a model file or a layer and write a config",
        description="Tune a model file or a layer: measure the candidates, gate them against "
        "an fp32 reference, and write the recommended settings as a config.",
    )
    groups = add_groups(p)
    add_workload_args(groups)
    add_search_args(groups)
    groups["search"].add_argument(
        "--accept-noisy",
        action="store_true",
        help="recommend a change even when PyTorch's default itself moved between its trial and "
        "the re-time (a busy machine); by default the default is then kept (default: off)",
    )
    groups["search"].add_argument(
        "--steps",
        type=int,
        help="the training (or inference) steps you expect to run: a one-off cost (a compile, "
        "cuDNN's search) is paid for only where it pays back within them (default: 10,000)",
    )
    budget = groups["budget and effort"]
    budget.add_argument(
        "--effort",
        choices=["quick", "default", "full"],
        default="default",
        help="quick: the global flags only, in seconds (no per-layer stage, no compile); "
        "default: every stage, compile included, the eager answer written first; full: more "
        "compile modes, every layer group and more rounds (default: default)",
    )
    budget.add_argument(
        "--budget",
        help="time for the whole run, e.g. 60s or 5m; when it runs out the best answer so far "
        "is written, with what was not measured (default: the space's budget.time_s)",
    )
    groups["storage"].add_argument(
        "--fresh",
        action="store_true",
        help="discard a stored study of the same name first (default: off, resume it)",
    )
    out = groups["output"]
    out.add_argument(
        "--out", default="tuned.json", help="config file to write (default: tuned.json)"
    )
    out.add_argument(
        "--quiet", action="store_true", help="no progress or table on stderr (default: off)"
    )
    out.add_argument(
        "--json", action="store_true", help="print the config as JSON on stdout (default: off)"
    )

    sub.add_parser("schema", help="print the config file's JSON Schema")

    p = sub.add_parser("show", help="describe a config file and whether it matches this machine")
    p.add_argument("config", help="a config file (tuned.json)")

    p = sub.add_parser("env", help="this machine's fingerprint, versions and what applies here")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")
    p.add_argument("--json", action="store_true", help="print it as JSON (default: off)")

    p = sub.add_parser("report", help="an HTML report (with PNG plots) from a config or a study")
    p.add_argument("source", help="a config file (tuned.json) or a study name in --storage")
    p.add_argument(
        "--storage", help="storage of the study (default: the SQLite file in the cache folder)"
    )
    p.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")

    p = sub.add_parser(
        "worker",
        help="evaluate trials of a shared study (one per GPU)",
        description="Evaluate trials of a study shared through --storage, beside other "
        "workers; `advisor advise` with the same options collects them.",
    )
    groups = add_groups(p, ("workload", "search", "budget and effort", "storage"))
    add_workload_args(groups)
    add_search_args(groups)
    return parser


def cmd_advise(args: argparse.Namespace) -> int:
    from advisor.stages.walltime import process_age_s

    age = process_age_s()  # the run began with this process: its start-up is the run's
    started = None if age is None else time.perf_counter() - age
    from advisor.config import check_outputs, output_paths
    from advisor.execute.streams import stdout_to_stderr
    from advisor.report.progress import ProgressReporter
    from advisor.service import run_advise
    from advisor.workload.preflight import check_workload_sizes

    check_workload_args(args)
    out = Path(args.out)
    # Before the search, not after it: the outputs can be written, the sizes can be held here.
    check_outputs(output_paths(out))
    workload = workload_kwargs(args)
    check_workload_sizes(args.device, **workload)
    reporter = ProgressReporter(enabled=not args.quiet)
    eager_written: list[Path] = []

    def write_eager(advice: Any) -> None:
        advice.save(out)  # the config and its CSVs, all or none (an OutputError names the file)
        eager_written.append(out)
        if not args.quiet:
            reporter.eager(advice, out)

    # stdout is the config's alone (--json): whatever the user's model prints while it is
    # imported, built and timed, here or in a worker process, goes to stderr.
    try:
        with stdout_to_stderr(), reporter:
            advice = run_advise(
                **workload,
                **search_kwargs(args),
                device=args.device,
                space=args.space,
                fresh=args.fresh,
                tolerances=tolerance_overrides(args),
                budget_s=duration_s(args.budget),
                accept_noisy=args.accept_noisy,
                steps=args.steps,
                effort=args.effort,
                on_eager=write_eager,
                progress=reporter.update,
                process_started=started,
            )
    except KeyboardInterrupt:
        if not eager_written:
            if args.storage != "memory":
                raise  # main says the study is stored
            print("advisor: interrupted before an answer was written; nothing was kept "
                  "(--storage memory): the same command starts afresh", file=sys.stderr)  # fmt: skip
            return 130
        print(f"advisor: interrupted during the compile stage: {out} keeps the eager answer "
              "(without torch.compile)", file=sys.stderr)  # fmt: skip
        return 130
    advice.save(out)  # the config and its CSVs, all or none (an OutputError names the file)
    if not args.quiet:
        reporter.summary(advice, out)
    if args.json:
        print(advice.config.model_dump_json(indent=2))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from advisor.config import config_schema

    print(json.dumps(config_schema(), indent=2))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from advisor.report.describe import describe_config

    print(describe_config(args.config))
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from advisor.report.describe import describe_env, env_dict

    if args.json:
        print(json.dumps(env_dict(args.device), indent=2))
    else:
        print(describe_env(args.device))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from advisor.report.write import png_dir, write_report

    out = write_report(args.source, args.out, args.storage)
    print(f"Wrote {out} (plots in {png_dir(out)}/)")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from advisor.worker import cli_worker

    return cli_worker(args)


COMMANDS: dict[str, Any] = {
    "advise": cmd_advise,
    "schema": cmd_schema,
    "show": cmd_show,
    "env": cmd_env,
    "report": cmd_report,
    "worker": cmd_worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except AdvisorError as e:
        print(f"advisor: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(
            "advisor: interrupted (the study is stored: run the same command to resume)",
            file=sys.stderr,
        )
        return 130


def run() -> NoReturn:
    """The `advisor` command and `python -m advisor`: `main` in a process that exits after it.

    What is imported and what the command made live until the exit: both are frozen out of the
    garbage collector (a caller of `main` keeps its collector as it was). The exit joins the
    other threads and runs every exit handler, without the interpreter's teardown of every
    module and object (`leave`). With `$ADVISOR_PROFILE_DIR` set it is profiled from the
    package's import on (`advisor.execute.profiling`)."""
    from advisor.execute.children import start_for_cli
    from advisor.execute.profiling import start
    from advisor.execute.worker_process import leave

    start("advisor")  # a no-op without the variable, or once the profile runs
    start_for_cli(sys.argv[1:])  # `advise` and `worker`: their children's server, a fork
    gc.freeze()
    code = main()
    gc.freeze()  # what the run made, too: no collection in the exit handlers walks it
    # What the interpreter's exit does before its exit handlers: the threads the command left
    # running (a library's, or a model's in-process) are waited for, as they would be.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None:  # pragma: no cover - another Python: its own exit, teardown included
        sys.exit(code)
    shutdown()
    leave(code)


if __name__ == "__main__":
    run()
