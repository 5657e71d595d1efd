"""The pages generated from the results table: the committed pages and README.md's cost table
are what benchmarks/results/runs.jsonl gives (this fails where they disagree), and a page shows
each key's newest row, how many commits old it is, and where the pick loses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import pages, table
from benchmarks.registry import ROOT


def _history() -> None:
    """Skip where git does not hold the commit the pages were generated at (a copy of the tree
    without its history): the pages' ages are counted to it."""
    head = pages.recorded_head(pages.INDEX.read_text())
    if pages.commits_old(head, head) is None:
        pytest.skip(f"needs the git history of commit {head}, which the pages count ages to")


def test_the_committed_pages_and_the_readmes_block_are_what_the_table_gives() -> None:
    _history()
    stale = pages.stale()
    assert not stale, f"regenerate with `python -m benchmarks page`: {stale}"


def test_the_readme_block_is_the_tables_newest_zoo_rows() -> None:
    _history()
    rows = table.read()
    head = pages.recorded_head(pages.INDEX.read_text())
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(pages.BEGIN):readme.index(pages.END) + len(pages.END)]
    assert block == pages.readme_block(rows, head)
    assert "results/cuda-" in block  # the GPU's rows stay beside newer CPU machines
    # every wall time it shows is the newest that run completed there
    newest = pages.newest([r for r in rows if r["status"] == "ok" and r.get("wall_s")], head)
    for line in block.splitlines()[4:-2]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        machine = cells[0].split("results/")[1].removesuffix(".md)")
        small = newest.get((machine, "small_cnn", "train", cells[1]))
        if cells[2] != "-":
            assert small is not None and f"{small['wall_s']:.1f} s" == cells[2]


def _row(commit: str, date: str, **kw: Any) -> dict[str, Any]:
    env = {"device_type": "cpu", "cpu_model": "AMD EPYC (family 25 model 17)", "torch_threads": 2,
           "cpu_capability": "AVX512 avx512_bf16", "logical_cpus": 2, "python": "3.11",
           "libraries": {"torch": "2.13.0"}}  # fmt: skip
    return {"schema": 1, "machine": "cpu-m", "commit": commit, "dirty": False, "model": "small_cnn",
            "mode": "train", "effort": "quick", "date": date, "command": "c", "env": env,
            "status": "ok", "wall_s": 10.0, "source": None, **kw}  # fmt: skip


_STAGES = {"global knobs": 20.0, "global knobs: precision checks": 4.0,
           "global knobs: output and layer checks": 1.0, "total": 30.0, "timed samples": 8.0}


def _worth(pick_ms: float, hand_ms: float) -> dict[str, Any]:
    def role(label: str, ms: float, first: float, one_off: str | None = None) -> dict[str, Any]:
        return {"label": label, "process": label, "median_ms": ms, "ci_ms": [ms, ms],
                "first_call_s": first, "one_off": one_off}  # fmt: skip

    return {"rounds": 9, "pick_role": "pick quick",
            "roles": {"default": role("default", 10.0, 0.1),
                      "pick quick": role("memory_format=channels_last", pick_ms, 0.1),
                      "hand": role("memory_format=channels_last, amp=bf16", hand_ms, 0.2)},
            "vs_default": {"pick quick": [10 / pick_ms] * 3, "hand": [10 / hand_ms] * 3},
            "pick_vs": {"pick quick": {"default": [10 / pick_ms] * 3,
                                       "hand": [hand_ms / pick_ms] * 3}},
            "loses_to": {"pick quick": ["hand"] if hand_ms < pick_ms else []}}  # fmt: skip


def test_a_page_shows_each_keys_newest_row_its_age_and_where_the_pick_loses() -> None:
    head = pages.head_commit()
    if head is None or pages.commits_old(f"{head}~3", head) is None:
        pytest.skip("needs this tree's git history")
    old = f"{head}~3"
    rows = [_row(head, "2026-01-01", wall_s=5.0, pick="memory_format=channels_last",
                 worth=_worth(8.0, 4.0)),
            _row(old, "2026-02-01", wall_s=99.0),  # later, but of an older commit: not shown
            _row(head, "2026-01-01", effort="default", wall_s=30.0, eager_s=12.0, dirty=True,
                 harness_share_gate_apart=0.68, stage_s=_STAGES)]  # fmt: skip
    text = pages.render_machine(rows, head)
    assert f"Figures as of commit `{head}`" in text and "(2 of 3 rows)" in text
    costs = [ln for ln in text.split("## What a run costs")[1].split("##")[0].splitlines()
             if ln.startswith("| small_cnn")]  # fmt: skip
    assert len(costs) == 2 and "| 5.0 |" in costs[1] and "99.0" not in text
    assert "| 30.0 | 12.0 |" in costs[0] and "| 0 (uncommitted changes) |" in costs[0]
    # the harness as a share and in seconds: 30 s less 8 s of samples and 5 s of the gate's
    assert "| 12.0 | 68% (17.0 s) |" in costs[0] and "| 5.0 | - | - |" in costs[1]
    worth = next(ln for ln in text.split("## What the advice is worth")[1].splitlines()
                 if ln.startswith("| small_cnn"))  # fmt: skip
    assert "| 1.25x [1.25, 1.25] |" in worth  # the pick against the default
    assert "hand (memory_format=channels_last, amp=bf16) 2.50x [2.50, 2.50], first call 0.2 s" in worth
    assert "**hand**: its time / the pick's 0.50x [0.50, 0.50]" in worth
    assert "| 9 | 0 |" in worth  # no spread recorded: nothing marked
    assert pages.commits_old(old, head) == 3 and pages.commits_old("nope", head) is None
    # A later run of the same commit without a re-time (compare's) is the cost shown, and the
    # earlier run's re-time stays on the page
    text = pages.render_machine([*rows, _row(head, "2026-03-01", wall_s=6.0)], head)
    assert "| 6.0 |" in text.split("## What the advice is worth")[0]
    assert "| 1.25x [1.25, 1.25] |" in text.split("## What the advice is worth")[1]


def test_a_retime_whose_samples_spread_wide_is_marked_noisy() -> None:
    worth = _worth(8.0, 4.0)
    worth["roles"]["default"]["iqr_ms"] = 1.5  # 15% of 10 ms: steady enough
    worth["roles"]["hand"]["iqr_ms"] = 0.4
    assert pages._rounds(worth) == "9"
    worth["roles"]["pick quick"]["iqr_ms"] = 2.0  # 25% of 8 ms
    assert pages._rounds(worth) == "9 (noisy: pick quick's samples spread 25% of its median)"


def test_a_changed_table_makes_the_pages_stale(tmp_path: Path) -> None:
    _history()
    rows = table.read()
    head = pages.recorded_head(pages.INDEX.read_text())
    shown = next(r for r in pages.newest(rows, head).values() if r.get("wall_s"))
    changed = tmp_path / "runs.jsonl"
    table.append([{**r, "wall_s": r["wall_s"] + 1.0} if r is shown else r for r in rows], changed)
    assert pages.stale(changed), "a page did not change with its data"


def test_the_readme_needs_its_markers_once() -> None:
    with pytest.raises(ValueError, match="needs one"):
        pages.with_block("no markers here", "x")
    assert pages.with_block(f"a {pages.BEGIN} old {pages.END} b", "NEW") == "a NEW b"


def test_a_capped_stand_in_is_named_so_and_kept_out_of_the_readme() -> None:
    # oneDNN capped below AVX-512 BF16 (docs/development.md#benchmarks): its page says so, and the
    # README's table of what a run costs keeps to machines users have
    row = _row("abc", "2026-03-01", machine="cpu-capped")
    row["env"] = {**row["env"], "cpu_capability": "AVX2 avx512_bf16 onednn<=AVX2"}
    label = pages.machine_label(row["env"])
    assert label == "AMD EPYC (family 25 model 17), oneDNN capped at AVX2, 2 threads"
    real = _row("abc", "2026-02-01")
    block = pages.readme_block([row, real], None)
    assert "results/cpu-m.md" in block and "cpu-capped" not in block
