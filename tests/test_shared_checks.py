"""A precision judged by training in one study of a model is known to the model's other studies on
this machine (`advisor.search.shared_checks`): quick effort then default, or another space, does
not train the same check again, and the advice says the verdict was reused."""

from __future__ import annotations

from pathlib import Path

import optuna
import torch

import advisor
from advisor.knobs import Settings
from advisor.measure.verdict import PrecisionCheck
from advisor.search.shared_checks import STUDY_PREFIX, SharedChecks
from advisor.search.storage import open_storage
from advisor.space import SearchSpace
from advisor.stages.walltime import breakdown
from advisor.workload.build import layer_workload
from advisor.workload.layer_spec import layer_spec
from tests.conftest import DATA

CPU = torch.device("cpu")
REUSED = " (judged by an earlier run on this machine, not trained again)"


def _verdict(steps: int = 8) -> PrecisionCheck:
    """A stored verdict as the search writes it (its numbers are not read here)."""
    return PrecisionCheck(precision="bf16", own_path=Settings(amp="bf16"), mode="train",
                          accepted=True, summary=f"bf16: trains like fp32 ({steps} steps)",
                          gap=0.001, band=0.01, seconds=1.5)  # fmt: skip


def test_the_key_is_the_workload_mode_device_and_check_settings_not_the_rest(
    tmp_path: Path,
) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}")
    w = layer_workload(layer_spec("Conv2d(4, 4, 3, padding=1)", input_shape="2,4,8,8"))
    base = SearchSpace(name="a", knobs={"amp": ["off", "bf16"]},
                       precision_check={"steps": 8, "batches": 2})  # fmt: skip
    first = SharedChecks(storage, "train-aaa@fp1", w, "train", CPU, base)
    assert first.read() == []
    first.add(_verdict())
    # another study of the same model: another space's knobs, timing and tolerances
    other_space = base.model_copy(update={
        "name": "b", "knobs": {"amp": ["off", "bf16"], "memory_format": ["channels_last"]},
        "timing": base.timing.model_copy(update={"max_time_s": 0.1}),
    })  # fmt: skip
    (got,) = SharedChecks(storage, "train-bbb@fp1", w, "train", CPU, other_space).read()
    assert got.reused and got.summary == _verdict().summary and got.seconds == 1.5
    # not shared: another check, mode, machine (fingerprint) or model
    other_check = base.model_copy(
        update={"precision_check": base.precision_check.model_copy(update={"steps": 12})}
    )
    other = layer_workload(layer_spec("Conv2d(4, 8, 3, padding=1)", input_shape="2,4,8,8"))
    for name, work, mode, space in (
        ("train-ccc@fp1", w, "train", other_check),
        ("infer-ddd@fp1", w, "infer", base),
        ("train-eee@fp2", w, "train", base),
        ("train-fff@fp1", other, "train", base),
    ):
        assert SharedChecks(storage, name, work, mode, CPU, space).read() == [], name
    # a verdict read back is not written again; a study named without its environment shares
    # nothing
    first.add(got.model_copy(update={"summary": "changed"}))
    assert [c.summary for c in first.read()] == [_verdict().summary]
    bare = SharedChecks(storage, "mine", w, "train", CPU, base)
    bare.add(_verdict())
    assert bare.read() == [] and bare.study is None
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert names == {f"{STUDY_PREFIX}fp1", f"{STUDY_PREFIX}fp2"}


def test_a_reused_verdict_costs_the_run_nothing_in_its_breakdown() -> None:
    from advisor.measure.results import TrialResult

    def result(check: PrecisionCheck) -> TrialResult:
        return TrialResult(settings=Settings(amp="bf16"), status="ok", precision_check=check)

    spans = {"global knobs": 5.0}
    fresh = breakdown(spans, [result(_verdict())], 5.0)
    assert fresh["global knobs: precision checks"] == 1.5
    reused = breakdown(spans, [result(_verdict().model_copy(update={"reused": True}))], 5.0)
    assert "global knobs: precision checks" not in reused


def test_a_second_study_of_the_model_reuses_the_verdict_and_fresh_judges_again(
    tmp_path: Path, precision_checks_run: list[str]
) -> None:
    calls = precision_checks_run

    def space(name: str, max_time_s: float) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"name: {name}\ndevice: cpu\nknobs: {{amp: ['off', bf16]}}\nper_layer: false\n"
            "race: false\nprecision_check: {steps: 12, batches: 2}\n"
            "timing: {warmup_runs: 1, warmup_s: 0, min_samples: 3, max_samples: 3, "
            f"max_time_s: {max_time_s}}}\n"
        )
        return str(path)

    kw = dict(model_file=str(DATA / "tiny_cnn.py"), mode="train", device="cpu",
              storage=f"sqlite:///{tmp_path / 's.db'}")  # fmt: skip
    first = advisor.advise(space=space("a", 0.1), **kw)
    assert calls == ["bf16"]
    (line,) = first.config.result.precisions
    assert not line.endswith(REUSED)
    assert first.config.result.stage_s.get("global knobs: precision checks", 0.0) > 0
    # another space (timing) is another study: its bf16 candidate is gated with the verdict
    second = advisor.advise(space=space("b", 0.05), **kw)
    assert calls == ["bf16"]
    assert second.config.workload["study"] != first.config.workload["study"]
    assert second.config.result.precisions == [line + REUSED]
    assert "global knobs: precision checks" not in second.config.result.stage_s
    bf16 = second.trials[second.trials["label"] == "amp=bf16"]
    assert list(bf16["status"]) == ["ok"]
    # fresh judges again, and says nothing of reuse
    again = advisor.advise(space=space("b", 0.05), fresh=True, **kw)
    assert calls == ["bf16", "bf16"]
    assert not again.config.result.precisions[0].endswith(REUSED)
