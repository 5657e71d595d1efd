"""A compiled candidate on a model with dropout is gated only once it wins the pick.

The gate compares a candidate's outputs and gradients with the fp32 reference's under the same
dropout masks (`advisor.measure.canonical_dropout`). For an eager candidate that is one more
step. For a compiled one it is another graph: the masks put the gate's dropout mode in it, so
its capture compiles the model again (MobileNetV3-Small train: 18-19 s on a 2-core Zen 5 and
44-48 s on a Zen 3, after a first compile of 40 s and 80-95 s). Most compiled candidates are not picked:
they do not pay their compile back within the run's steps, or the re-time ranks an eager
candidate first. So the compile stage measures them without that capture (`Race.defer_gate`:
the result says `gate_pending`), the re-time and the pick treat them as any measured candidate,
and only the pick, if it is one, is gated here (`Evaluator.gate`). A rejected or failed gate
takes it out of the pick, and the next pick is gated in turn where it is pending too: a
candidate is never recommended ungated.
"""

from __future__ import annotations

from collections.abc import Sequence

from advisor.execute.evaluators import Evaluator
from advisor.execute.gating import settle
from advisor.measure.results import TrialResult
from advisor.search import SearchOutcome
from advisor.search.pick import pick_for_steps
from advisor.search.storage import LayerStore, open_storage

__all__ = ["gate_the_pick"]

def gate_the_pick(
    outcome: SearchOutcome,
    evaluator: Evaluator,
    min_gain: float,
    steps: int | None,
    storage: str | None,
) -> list[TrialResult]:
    """Gate the pick while it is pending (see the module's docstring), each verdict put in the
    outcome and stored beside the compile stage's results; the results it gated, in order."""
    gated: list[TrialResult] = []
    while True:
        chosen = pick_for_steps(outcome.results, outcome.baseline, min_gain, steps)[0].chosen
        if not chosen.gate_pending:
            return gated
        settled = settle(chosen, evaluator.gate(chosen.settings))
        _replace(outcome, chosen, settled)
        LayerStore(open_storage(storage), outcome.study_name).add_model_result(settled)
        gated.append(settled)


def _replace(outcome: SearchOutcome, old: TrialResult, new: TrialResult) -> None:
    def swap(rs: Sequence[TrialResult]) -> list[TrialResult]:
        return [new if r is old else r for r in rs]

    outcome.results = swap(outcome.results)
    outcome.pareto = swap(outcome.pareto)
