"""`advisor report`: real quick searches, real files, the HTML checked for self-containment."""

from __future__ import annotations

import importlib.util
import json
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
import yaml

import advisor
from advisor.errors import AdvisorError, StorageError
from advisor.report.importance import knob_importance
from advisor.report.load import load_report_data
from advisor.report.write import png_dir, write_report
from advisor.search.ledger import RECORD_FORMAT
from tests._cli import advisor_cli, advisor_cli_many, one_line_error
from tests.conftest import FAST_SPACE, as_searched

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def strict_bf16_space(folder: Path) -> str:
    """The fast test space with a bf16 layer tolerance nothing meets: bf16 candidates get
    rejected (by the per-layer check against float64; bf16 itself trains like fp32 here)."""
    data = yaml.safe_load(Path(FAST_SPACE).read_text())
    data["name"] = "fast_cpu_strict_bf16"
    data["layer_tolerances"] = {"fp32": 1e-4, "tf32": 2e-3, "fp16": 3e-3, "bf16": 1e-12}
    data["precision_check"] = {"steps": 12, "batches": 2}
    path = folder / "strict.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A config (with its trials CSV) from a real search, and the storage holding its study."""
    folder = tmp_path_factory.mktemp("report")
    storage = f"sqlite:///{folder / 'studies.db'}"
    advice = advisor.advise(
        layer="Conv2d(3, 8, 3, padding=1)",
        input_shape="1,3,24,24",
        device="cpu",
        mode="train",
        space=strict_bf16_space(folder),
        storage=storage,
        study_name="report-test",
    )
    path = advice.save(folder / "tuned.json")
    return path, storage, advice.config.workload["study"]


class Refs(HTMLParser):
    """Every src/href of a tag (script bodies are not parsed as markup, as in a browser)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str]] = []
        self.tags: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.refs += [(tag, v or "") for k, v in attrs if k in ("src", "href")]


def check_self_contained(html_text: str) -> Refs:
    parser = Refs()
    parser.feed(html_text)
    for tag, ref in parser.refs:
        assert ref.startswith("data:"), f"<{tag}> refers to {ref[:80]}: the report must be offline"
    assert parser.tags.get("link", 0) == 0
    return parser


def check_png(path: Path) -> None:
    payload = path.read_bytes()
    assert payload[:8] == PNG_MAGIC, path
    width, height = struct.unpack(">II", payload[16:24])  # the IHDR chunk
    assert width > 300 and height > 150, (path, width, height)


def test_report_from_config_with_study(tuned: tuple[Path, str, str], tmp_path: Path) -> None:
    config, storage, study = tuned
    out = tmp_path / "report.html"
    r = advisor_cli("report", str(config), "--storage", storage, "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    refs = check_self_contained(text)
    assert refs.tags.get("img", 0) >= 1 and 'src="data:image/png;base64,' in text
    assert "plotly-graph-div" in text  # optuna's interactive history (plotly.js inline)
    assert f"trials from study {study!r}".replace("'", "&#x27;") in text
    for section in ("Summary", "Time per candidate", "Rejected and failed", "Environment"):
        assert section in text
    assert "error too high" in text  # the bf16 candidates, with the reason why
    cfg = json.loads(config.read_text())
    assert f"{cfg['result']['speedup']:.2f}x" in text
    assert cfg["environment"]["fingerprint"] in text
    if importlib.util.find_spec("advisor.measure.roofline") is not None:  # an optional column
        assert "Roofline fraction" in text
    pngs = sorted(png_dir(out).glob("*.png"))
    assert {p.stem for p in pngs} >= {"time", "history"}
    for p in pngs:
        check_png(p)


def test_report_from_study_name(tuned: tuple[Path, str, str], tmp_path: Path) -> None:
    _, storage, study = tuned
    for name in (study, "report-test"):  # the fingerprint suffix may be left out
        out = write_report(name, tmp_path / f"{len(name)}.html", storage)
        data = load_report_data(name, storage)
        assert data.config is not None and data.config.result is not None
        assert data.config.result.trials == len(data.trials) and data.config.result.rejected >= 1
        check_self_contained(out.read_text())
        check_png(png_dir(out) / "time.png")


def test_report_without_study_uses_trials_csv(tuned: tuple[Path, str, str], tmp_path: Path) -> None:
    config, _, _ = tuned
    elsewhere = f"sqlite:///{tmp_path / 'empty.db'}"  # no such file: not created either
    out = write_report(str(config), tmp_path / "r.html", elsewhere)
    text = out.read_text()
    assert "tuned.trials.csv" in text and "needs the optuna study" in text
    assert not (tmp_path / "empty.db").exists()
    check_self_contained(text)
    check_png(png_dir(out) / "time.png")
    assert not (png_dir(out) / "history.png").exists()


def test_a_config_whose_study_has_another_record_format_is_reported_from_its_csv(
    tuned: tuple[Path, str, str], tmp_path: Path
) -> None:
    import shutil

    import optuna

    config, storage, study = tuned
    copy = tmp_path / "studies.db"
    shutil.copy(storage.removeprefix("sqlite:///"), copy)
    old = optuna.load_study(study_name=study, storage=f"sqlite:///{copy}")
    old.set_user_attr("record_format", RECORD_FORMAT - 1)
    text = write_report(str(config), tmp_path / "r.html", f"sqlite:///{copy}").read_text()
    assert "study not read (study" in text and f"record format {RECORD_FORMAT - 1}" in text
    assert "tuned.trials.csv" in text


def test_a_trials_csv_row_without_a_kind_reads_its_status_words(tmp_path: Path) -> None:
    # A CSV's empty cell comes back as NaN: a failure of no known kind reads "raised an error",
    # not the words of a kind spelt "nan"; a rejection's kind reads its own words.
    from advisor.advice import csv_text
    from advisor.report.load import _trials_from_csv
    from advisor.report.page import _bad_html

    path = tmp_path / "t.trials.csv"
    ms = {"median_ms": 1.0, "ci_low_ms": 0.9, "ci_high_ms": 1.1}
    path.write_text(csv_text([
        {"label": "a", "status": "failed", "kind": "", "reason": "boom", **ms},
        {"label": "b", "status": "rejected", "kind": "not_finite", "reason": "NaN", **ms},
    ]))  # fmt: skip
    html = _bad_html(_trials_from_csv(path))
    assert "raised an error" in html and "NaN/Inf in results" in html
    assert html.count("NaN/Inf in results") == 1


def test_report_from_config_alone(tuned: tuple[Path, str, str], tmp_path: Path) -> None:
    config, _, _ = tuned
    lone = tmp_path / "lone.json"
    lone.write_text(config.read_text())  # no trials CSV beside it
    out = write_report(str(lone), tmp_path / "lone.html", f"sqlite:///{tmp_path / 'none.db'}")
    assert "only the config" in out.read_text()
    check_png(png_dir(out) / "time.png")


def test_importance_not_computable_is_explained() -> None:
    import optuna

    study = optuna.create_study()
    with pytest.raises(ValueError, match="at least 2"):
        knob_importance(study)
    study.enqueue_trial({"amp": "off"})
    study.enqueue_trial({"amp": "off"})
    study.optimize(lambda t: float(len(t.suggest_categorical("amp", ["off", "bf16"]))), 2)
    with pytest.raises(ValueError, match="more than one value"):
        knob_importance(study)


@pytest.mark.slow  # CLI processes (3 s)
def test_bad_source_is_one_line_exit_2_and_no_file(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    sources = {
        "no config file or study named": ["no-such-study"],
        "not found": [str(tmp_path / "missing.json")],
        "not valid JSON": [str(tmp_path / "bad.json")],
        "memory holds no studies": ["x", "--storage", "memory"],
    }
    outs = {needle: tmp_path / f"out{i}.html" for i, needle in enumerate(sources)}
    ran = advisor_cli_many(  # one interpreter for all four: what each prints and returns
        {needle: ["report", *src, "--out", str(outs[needle])] for needle, src in sources.items()}
    )
    for needle, r in ran.items():
        one_line_error(r, needle)
        assert not outs[needle].exists() and not png_dir(outs[needle]).exists()


def test_out_is_a_directory(tuned: tuple[Path, str, str], tmp_path: Path) -> None:
    with pytest.raises(AdvisorError, match="is a directory"):
        write_report(str(tuned[0]), tmp_path, tuned[1])


def test_time_plot_marks_failed_candidates(tuned: tuple[Path, str, str], tmp_path: Path) -> None:
    import pandas as pd

    from advisor.report.load import _trials_from_csv
    from advisor.report.plots import _png, time_figure

    config, _, _ = tuned
    df = _trials_from_csv(config.with_name("tuned.trials.csv"))
    crashed = {"label": "conv_impl=triton", "status": "failed", "reason": "worker crashed"}
    df = pd.concat([df, pd.DataFrame([crashed])], ignore_index=True)
    fig = time_figure(df, "default", None)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "conv_impl=triton" in labels
    assert "failed (no timing)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert _png(fig)[:8] == PNG_MAGIC


@pytest.mark.parametrize("min_gain", [0.02, 0.5])
def test_report_pick_uses_the_study_min_gain(tmp_path: Path, min_gain: float) -> None:
    """channels_last is 10% faster beyond noise: picked under 0.02, not under a space asking for
    50%; the report's summary must follow the study. A study stored in an earlier record format
    is refused in one line."""
    import optuna
    from optuna.trial import create_trial

    from advisor.knobs import Settings
    from advisor.measure.results import TrialResult
    from advisor.measure.stats import Measurement

    def result(ms: float, **knobs: str) -> TrialResult:
        samples = [ms * (1 + 0.001 * i) for i in range(-10, 11)]
        return TrialResult(
            settings=Settings(**knobs), status="ok", measurement=Measurement(samples_ms=samples)
        )

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="gain", storage=storage)
    as_searched(study, min_gain, record_format=RECORD_FORMAT - 1)
    for r in (result(10.0), result(9.0, memory_format="channels_last")):
        user_attrs = {"result": r.model_dump(mode="json")}
        study.add_trial(create_trial(value=r.median_ms, user_attrs=user_attrs))
    with pytest.raises(StorageError, match=r"^study 'gain' was stored by an earlier version"):
        load_report_data("gain", storage)
    if min_gain == 0.5:  # the command: one line, exit 2, no page written
        r = advisor_cli("report", "gain", "--storage", storage, "--out", str(tmp_path / "r.html"))
        one_line_error(r, f"record format {RECORD_FORMAT - 1}, this one reads {RECORD_FORMAT}")
        assert not (tmp_path / "r.html").exists()
    study.set_user_attr("record_format", RECORD_FORMAT)
    config = load_report_data("gain", storage).config
    assert config is not None and config.result is not None
    picked = "default" if min_gain == 0.5 else "memory_format=channels_last"
    assert config.settings.label() == picked, config.result.why
    assert config.result.min_gain == min_gain and config.result.trials == 2


def test_a_study_without_what_advise_stores_is_one_line(tmp_path: Path) -> None:
    """A study of this record format that lacks an attribute the search stores, or holds one
    this version cannot read, is refused in one line, not a traceback."""
    import optuna
    from optuna.trial import create_trial

    from advisor.knobs import Settings
    from advisor.measure.results import TrialResult
    from advisor.measure.stats import Measurement

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="bare", storage=storage)
    as_searched(study)
    r = TrialResult(settings=Settings(), status="ok", measurement=Measurement(samples_ms=[1.0] * 5))
    study.add_trial(create_trial(value=1.0, user_attrs={"result": r.model_dump(mode="json")}))
    assert load_report_data("bare", storage).config is not None
    other = optuna.create_study(study_name="other", storage=storage)
    other.set_user_attr("record_format", RECORD_FORMAT)  # and nothing else
    other.add_trial(create_trial(value=1.0, user_attrs={"result": r.model_dump(mode="json")}))
    with pytest.raises(StorageError, match=r"^study 'other' does not hold what .*\(no '\w+'\)$"):
        load_report_data("other", storage)
    study.set_user_attr("environment", {"device_type": "cpu"})  # its other fields missing
    r_html = tmp_path / "r.html"
    cli = advisor_cli("report", "bare", "--storage", storage, "--out", str(r_html))
    one_line_error(cli, "study 'bare' does not hold what advise stores with a study (")
    assert not r_html.exists()


def test_layer_rows_take_the_roofline_at_the_precision_measured() -> None:
    """A layer measured under amp=bf16 (really, on this CPU) is judged against this machine's
    bf16 peak with 2-byte elements; a TF32 result, as a GPU records it, has no peak on a CPU and
    says so in the report."""
    import optuna
    from optuna.trial import create_trial

    from advisor.device.environment import current_environment
    from advisor.execute.runner import Gate, evaluate
    from advisor.measure import roofline
    from advisor.measure.stopping import TimingPolicy
    from advisor.report.layer_rows import layer_rows
    from advisor.report.load import ReportData
    from advisor.report.page import _layers_html
    from advisor.space import SearchSpace
    from advisor.workload.build import layer_workload
    from advisor.workload.layer_spec import layer_spec

    spec = layer_spec("Conv2d(4, 8, 3, padding=1)", input_shape="1,4,12,12")
    w = layer_workload(spec)
    space = SearchSpace(name="t", knobs={})
    policy = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_samples=3, max_time_s=0.05)
    cpu = torch.device("cpu")
    gate = Gate(w, cpu, "train", space)
    r = evaluate(w, advisor.Settings(amp="bf16"), cpu, "train", space, gate, policy=policy)
    assert r.precision == "bf16" and r.measurement is not None
    gpu_like = r.model_copy(update={"settings": advisor.Settings(), "precision": "tf32"})
    study = optuna.create_study()
    attrs = {"spec": spec.model_dump(mode="json"), "impl": "native", "names": ["conv"],
             "description": "Conv2d(4, 8, 3)"}  # fmt: skip
    for res in (r, gpu_like):
        result = res.model_dump(mode="json")
        study.add_trial(create_trial(value=res.median_ms, user_attrs={**attrs, "result": result}))
    env = current_environment("cpu").model_dump(mode="json")
    bf16_row, tf32_row = layer_rows(study, "train", env)
    want = roofline.layer_fraction(attrs["spec"], "train", r.median_ms, "cpu", "bf16")
    assert (bf16_row["roofline"], bf16_row["roofline_at"]) == (want, "bf16")
    assert (tf32_row["roofline"], tf32_row["roofline_at"]) == (None, "tf32 n/a on cpu")
    data = ReportData("t", "train", "study", env, None, None, layer_rows=[bf16_row, tf32_row])
    html = _layers_html(data)  # type: ignore[arg-type]
    assert f"{want:.0%} bf16" in html and "- (tf32 n/a on cpu)" in html
