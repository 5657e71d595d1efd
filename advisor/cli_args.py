"""The command-line options that `advisor advise` and `advisor worker` share, and what they map to.

Both commands take the same workload and search options, so both name the same study; `advisor.cli`
(the commands) and `advisor.worker` import them from here, and neither imports the other at load.
The returned dicts are named exactly as `workload.args.make_workload` and `search.SearchOptions` take
them.
"""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from advisor.errors import AdvisorError

__all__ = [
    "GROUPS",
    "add_groups",
    "add_search_args",
    "add_workload_args",
    "check_workload_args",
    "search_kwargs",
    "tolerance_overrides",
    "workload_kwargs",
]


# The option groups of `advisor advise --help`, in order (`advisor worker` has the first four).
GROUPS = {
    "workload": "what is tuned, and how it runs",
    "search": "what is tried, and how each candidate is judged",
    "budget and effort": "how much time the run takes",
    "storage": "where the measurements are kept (a run resumes its study)",
    "output": "what is written and shown",
}

Groups = dict[str, "argparse._ArgumentGroup"]
_N = TypeVar("_N", int, float)


def add_groups(p: argparse.ArgumentParser, names: tuple[str, ...] = tuple(GROUPS)) -> Groups:
    """The parser's option groups (`GROUPS`), empty, in order."""
    return {name: p.add_argument_group(name, GROUPS[name]) for name in names}


def add_workload_args(groups: Groups) -> None:
    g = groups["workload"]
    g.add_argument(
        "model_file",
        nargs="?",
        help="Python file defining build_model() and example_inputs(), or "
        "package.module[:function] (default: none; give it or --layer)",
    )
    g.add_argument(
        "--layer",
        help="a layer as written in PyTorch, e.g. 'Conv2d(64, 64, 3, padding=1)' (default: none)",
    )
    g.add_argument("--layer-file", help="YAML/JSON file with the layer's fields (default: none)")
    g.add_argument(
        "--input-shape",
        action="append",
        help="input shape for --layer, e.g. 8,64,56,56; repeat it for a shape set (variable "
        "image sizes) (default: none; required with --layer)",
    )
    g.add_argument(
        "--batch-sizes",
        help="a shape set over batch sizes, e.g. 8,16,32,64 (default: the inputs' own)",
    )
    g.add_argument(
        "--shape-weights",
        help="weights of the shape set's shapes, e.g. 1,1,2,4 (default: equal)",
    )
    g.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        help="the layer's dtype (default: float32, or the layer file's)",
    )
    g.add_argument(
        "--first-layer",
        action="store_true",
        help="the layer takes the network's input: in train mode its input needs no gradient "
        "(default: off)",
    )
    g.add_argument(
        "--build", default="build_model", help="model factory name (default: build_model)"
    )
    g.add_argument(
        "--inputs",
        default="example_inputs",
        help="inputs factory name (default: example_inputs)",
    )
    g.add_argument(
        "--mode",
        choices=["infer", "train"],
        default="infer",
        help="infer: forward under no_grad; train: forward + backward (default: infer)",
    )
    g.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")


def add_search_args(groups: Groups) -> None:
    """The search options: the "search", "budget and effort" and "storage" groups' shared part
    (`advisor advise` adds its own to those groups)."""
    g = groups["search"]
    g.add_argument(
        "--space",
        help="search-space name (cpu, cuda, strict_fp32) or YAML file (default: the device's, "
        "cpu or cuda)",
    )
    g.add_argument(
        "--in-process",
        action="store_true",
        help="run candidates in this process (faster; a crash ends the search) (default: off, "
        "each in a worker process)",
    )
    g.add_argument(
        "--max-memory",
        type=float,
        help="reject candidates whose peak memory (MB) is above this (default: no limit)",
    )
    g.add_argument(
        "--objectives",
        choices=["time", "time,memory"],
        default="time",
        help="time, or time,memory for the Pareto set (default: time)",
    )
    g.add_argument(
        "--tolerance",
        action="append",
        metavar="KEY=VALUE",
        help="override a numeric-gate setting of the space, e.g. grad_tolerances.fp32=2e-3 "
        "(repeatable; the result names the one that would accept a rejected candidate) "
        "(default: the space's)",
    )
    g = groups["budget and effort"]
    g.add_argument(
        "--trials",
        type=int,
        help="most candidates to measure (default: the space's budget.trials)",
    )
    g.add_argument(
        "--trial-timeout",
        type=float,
        default=600.0,
        help="seconds per trial before it is killed (isolated mode) (default: 600)",
    )
    g = groups["storage"]
    g.add_argument(
        "--storage",
        help="study storage: a sqlite:/// or postgresql:// URL, a journal file path, or 'memory' "
        "(default: a SQLite file in the cache folder)",
    )
    g.add_argument(
        "--study-name",
        help="study name, the environment fingerprint appended (default: the mode and a hash of "
        "the workload and the space)",
    )


def _numbers(text: str | None, option: str, kind: type[_N], what: str) -> list[_N] | None:
    """`text` ('8,16,32') as a list of `kind` values; `what` they are, for the error."""
    if text is None:
        return None
    try:
        return [kind(v) for v in text.split(",")]  # an empty part is a typo, not a separator
    except ValueError:
        raise AdvisorError(f"{option} takes comma-separated {what}, got {text!r}") from None


def check_workload_args(args: argparse.Namespace) -> None:
    if args.model_file and (args.layer or args.layer_file):
        raise AdvisorError("give a model file or --layer, not both")
    if not args.model_file and not (args.layer or args.layer_file):
        raise AdvisorError("nothing to tune: give a model file or --layer with --input-shape")
    if args.trials is not None and args.trials < 1:
        raise AdvisorError("--trials must be at least 1")


def workload_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The workload options, as `workload.args.make_workload` takes them."""
    return {
        "model_file": args.model_file,
        "layer": args.layer,
        "layer_file": args.layer_file,
        "input_shapes": args.input_shape,
        "batch_sizes": _numbers(args.batch_sizes, "--batch-sizes", int, "integers"),
        "shape_weights": _numbers(args.shape_weights, "--shape-weights", float, "numbers"),
        "dtype": args.dtype,
        "first_layer": args.first_layer,
        "build": args.build,
        "inputs_fn": args.inputs,
    }


def duration_s(text: str | None) -> float | None:
    """'90', '90s', '2m', '1.5h' -> seconds (a one-line error otherwise)."""
    if text is None:
        return None
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    t = text.strip().lower()
    scale = units.get(t[-1:])
    try:
        value = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        raise AdvisorError(f"--budget takes a time such as 60s, 5m or 90, got {text!r}") from None
    if not value > 0:
        raise AdvisorError(f"--budget must be a positive time, got {text!r}")
    return value


def tolerance_overrides(args: argparse.Namespace) -> dict[str, float]:
    """--tolerance KEY=VALUE options as a dict (see `space.with_tolerances`)."""
    out: dict[str, float] = {}
    for item in args.tolerance or []:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise AdvisorError(
                f"--tolerance takes KEY=VALUE, e.g. grad_tolerances.fp32=2e-3, got {item!r}"
            ) from None
    return out


def search_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The search options, named as `search.SearchOptions` (and `run_advise`) name them."""
    return {
        "mode": args.mode,
        "trials": args.trials,
        "storage": args.storage,
        "study_name": args.study_name,
        "isolate": not args.in_process,
        "trial_timeout_s": args.trial_timeout,
        "max_memory_mb": args.max_memory,
        "objectives": tuple(args.objectives.split(",")),
    }
