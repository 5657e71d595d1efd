"""What the user sees at the end of `advise`: the summary tables, and --quiet/--json streams."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from rich.console import Console

import advisor
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stop import Stop
from advisor.report.progress import kind_beside, status_text, summary_tables
from advisor.search.options import SearchOutcome
from tests._cli import advisor_cli
from tests.test_report import strict_bf16_space

if TYPE_CHECKING:
    from advisor.advice import Advice


@pytest.fixture(scope="module")
def advice(tmp_path_factory: pytest.TempPathFactory) -> Advice:
    folder = tmp_path_factory.mktemp("progress")
    return advisor.advise(
        layer="Conv2d(3, 8, 3, padding=1)",
        input_shape="1,3,24,24",
        device="cpu",
        mode="infer",
        space=strict_bf16_space(folder),
    )


def render(advice: Advice) -> str:
    console = Console(record=True, width=200)
    for table in summary_tables(advice):
        console.print(table)
    return console.export_text()


def test_summary_tables_show_baseline_singles_and_rejections(advice: Advice) -> None:
    text = render(advice)
    r = advice.config.result
    assert r is not None
    assert "PyTorch default" in text and "recommended" in text
    assert f"{r.speedup:.2f}x [{r.speedup_ci[0]:.2f}, {r.speedup_ci[1]:.2f}]" in text
    assert "Each single change from the default" in text
    assert "memory_format=channels_last" in text and "amp=bf16" in text
    assert "vs default [95% CI]" in text
    assert "Rejected or failed candidates" in text and "error too high" in text
    assert "over the bf16 layer tolerance" in text  # the reason, verbatim


SLOWER = "stopped after 6 samples: slower than the best candidate's 1.250 ms (sign test, p <= 0.05)"


@pytest.mark.parametrize(
    "status,kind,text",
    [
        ("ok", "", "ok"),
        ("not gated", "", "not gated"),
        ("stopped", "raced", "stopped: slower (raced out)"),
        ("stopped", "budget", "stopped: time budget"),
        ("stopped", "out_of_time", "stopped: time budget"),
        ("stopped", "screened", "stopped: screened out"),
        ("stopped", "cannot_pay", "stopped: compile cannot pay back"),
        ("stopped", "", "stopped early"),  # a trials table without the kind column
        ("rejected", "not_finite", "rejected: NaN/Inf in results"),
        ("rejected", "tolerance", "rejected: error too high"),
        ("rejected", "precision", "rejected: precision not accepted"),
        ("rejected", "memory", "rejected: over the memory limit"),
        ("rejected", "", "rejected"),
        ("failed", "oom", "failed: out of memory"),
        ("failed", "device", "failed: device error"),
        ("failed", "crash", "failed: crashed"),
        ("failed", "timeout", "failed: timed out"),
        ("failed", "", "failed: raised an error"),
    ],
)
def test_a_status_text_says_each_word_once(status: str, kind: str, text: str) -> None:
    assert status_text(status, kind) == text
    words = text.replace(":", "").split()
    assert len(words) == len(set(words)), text
    assert kind_beside(status, kind) != status


def test_the_words_come_from_the_kind_not_the_reason() -> None:
    # Each producer names its kind: the gate (NaN or Inf, a tolerance, a training check), the
    # memory limit, an error read off its own text (out of memory), the isolated worker (a crash,
    # a time limit). The reason is for a person and never read here.
    from advisor.execute.gating import failed

    assert failed(Settings(), "RuntimeError: out of memory").kind == "oom"
    assert failed(Settings(), "worker crashed (SIGSEGV)").kind == ""  # text is not read
    assert failed(Settings(), "worker crashed (SIGSEGV)", kind="crash").kind == "crash"
    stopped = TrialResult(settings=Settings(), status="stopped", stop=Stop(kind="screened"),
                          reason="slower than the best (a reason that says otherwise)")  # fmt: skip
    assert status_text(stopped.status, stopped.kind) == "stopped: screened out"


def test_the_single_change_table_says_stopped_once(advice: Advice) -> None:
    # A single change raced out: the table's status reads "stopped: slower (raced out)", not
    # "stopped: stopped early: slower".
    import copy

    i, single = next((i, r) for i, r in enumerate(advice.results)
                     if len(r.settings.changes()) == 1 and r.status == "ok")  # fmt: skip
    results = list(advice.results)
    stop = Stop(kind="raced", samples=6, bar_ms=1.25, ms=2.0)
    results[i] = single.model_copy(update={"status": "stopped", "stop": stop, "reason": SLOWER})
    raced = copy.copy(advice)
    raced.outcome = SearchOutcome(results, advice.baseline,
                                  environment=advice.outcome.environment)  # fmt: skip
    rows = [line for line in render(raced).splitlines() if single.settings.label() in line]
    stopped = [row for row in rows if "stopped" in row]
    assert len(stopped) == 1 and "stopped: slower (raced out)" in stopped[0], rows
    assert stopped[0].count("stopped") == 1, stopped[0]


@pytest.mark.slow  # a CLI run (6 s); hostile/test_stdout's in-process run reads its streams
def test_quiet_json_prints_only_the_config(tmp_path: Path, fast_space: str) -> None:
    out = tmp_path / "t.json"
    r = advisor_cli("advise", "--layer", "Conv2d(3, 4, 3)", "--input-shape", "1,3,16,16",
                    "--device", "cpu", "--space", fast_space, "--storage", "memory",
                    "--in-process", "--out", str(out), "--quiet", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress bar, no table
    assert json.loads(r.stdout) == json.loads(out.read_text())
