"""`advisor worker`: evaluate trials of a shared study, e.g. one worker per GPU on a cluster.

A worker takes the same workload and search options as `advisor advise`, so both name the same
study (workload, mode, space and this machine's environment fingerprint). It enqueues the grid
(skipping points already there), evaluates trials until every point has a result, prints one
summary line and writes no config: `advisor advise` with the same arguments then collects the
results and writes the config without measuring anything again. See docs/scale-out.md.
"""

from __future__ import annotations

import argparse

from advisor.cli_args import (
    check_workload_args,
    search_kwargs,
    tolerance_overrides,
    workload_kwargs,
)
from advisor.errors import AdvisorError


def cli_worker(args: argparse.Namespace) -> int:
    """Join the study named by these arguments and evaluate its trials until it is done."""
    if not args.storage or args.storage == "memory":
        raise AdvisorError(
            "advisor worker needs --storage shared with the other workers: a postgresql:// URL "
            "(many machines), or a sqlite:/// file or journal path (one machine)"
        )
    check_workload_args(args)
    from advisor.device.environment import resolve_device
    from advisor.execute.probe import hand_over, probe_model
    from advisor.execute.streams import stdout_to_stderr
    from advisor.search.options import SearchOptions
    from advisor.search.run import make_evaluator, work
    from advisor.space import load_space, with_tolerances
    from advisor.workload.args import make_workload
    from advisor.workload.preflight import check_workload_sizes

    device = resolve_device(args.device)
    space = with_tolerances(load_space(args.space, device), tolerance_overrides(args))
    kwargs = workload_kwargs(args)
    check_workload_sizes(device, **kwargs)
    with stdout_to_stderr():  # the user's model prints to stderr; stdout has the summary alone
        options = SearchOptions(**search_kwargs(args))
        probed = None
        if options.isolate and kwargs.get("model_file") is not None:
            probed = probe_model(kwargs, options.mode, str(device), options.trial_timeout_s,
                                 keep=True)  # fmt: skip
        evaluator = None
        try:
            workload = make_workload(**kwargs)
            evaluator = make_evaluator(workload, device, space, options)
            hand_over(probed, evaluator)  # the probe's child: the worker
            probed = None
            s = work(workload, device, space, options, evaluator=evaluator)
        finally:
            if probed is not None:
                probed.close()
            if evaluator is not None:
                evaluator.close()
    failed = f" ({s.failed_here} failed)" if s.failed_here else ""
    print(
        f"advisor worker: study {s.study_name}: evaluated {s.evaluated_here} trial(s) here"
        f"{failed}; {s.evaluated}/{s.total} points done in {s.elapsed_s:.1f} s"
    )
    return 0
