"""The benchmark tool's advise runner, its config adapter, the plan that runs parts under one
deadline and appends rows, and compare's worktrees.

The runner runs `python -m advisor advise` from a tree; here the tree is a folder whose
`advisor` is a stand-in that prints and writes what the real one does (an eager answer, a
config; or an error; or it waits for Ctrl-C and then writes the answer it has), so the
runner's clock, its Ctrl-C and its reading of the config are checked in seconds."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from benchmarks import plan
from benchmarks.registry import ROOT, Model, UsageError
from benchmarks.runner import advise, label, row_from_config
from benchmarks.table import KEY, read

FAKE = textwrap.dedent('''
    import json, os, signal, sys, time
    args = sys.argv[1:]
    out = args[args.index("--out") + 1]
    effort = args[args.index("--effort") + 1] if "--effort" in args else "default"

    def answer(kind):
        result = {"speedup": 1.5, "speedup_ci": [1.4, 1.6], "why": "fastest", "effort": effort,
                  "answer": kind, "trials": 3, "rejected": 1, "tuning_s": 1.0,
                  "stage_s": {"global knobs": 1.5, "global knobs: precision checks": 0.5,
                              "timed samples": 0.5, "total": 2.0},
                  "final_check": {"where": "fresh process", "speedup": 1.4,
                                  "speedup_ci": [1.3, 1.5], "rounds": 20, "held": True,
                                  "first_call_s": 0.1},
                  "notes": ["a note"]}
        with open(out, "w") as f:
            json.dump({"settings": {"memory_format": "channels_last", "amp": "bf16"},
                       "result": result}, f)

    how = os.environ.get("FAKE_ADVISOR", "ok")
    if how == "fail":
        print("advisor: error: cannot build the model", file=sys.stderr)
        sys.exit(2)
    if how == "hang":
        def stop(*_):
            answer("eager")
            sys.exit(130)
        signal.signal(signal.SIGINT, stop)
        print("Eager answer: memory_format=channels_last", file=sys.stderr, flush=True)
        time.sleep(60)
    time.sleep(0.3)
    print("Eager answer: memory_format=channels_last, amp=bf16", file=sys.stderr, flush=True)
    time.sleep(0.5)
    answer("final")
''')
TINY = Model("tiny", "tests/data/tiny_cnn.py", "a tiny CNN", modes=("train",))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A folder whose `python -m advisor` is the stand-in above."""
    root = tmp_path / "tree"
    (root / "advisor").mkdir(parents=True)
    (root / "advisor" / "__init__.py").write_text("")
    (root / "advisor" / "__main__.py").write_text(FAKE)
    (root / "advisor" / "unused.py").write_text("UNUSED = True\n")  # imported by no run
    return root


def test_a_run_is_timed_end_to_end_and_its_config_read(tree: Path, tmp_path: Path) -> None:
    run = advise(TINY, "train", "quick", "cpu", limit_s=60, work=tmp_path, tree=tree,
                 log=lambda _: None)  # fmt: skip
    assert run["status"] == "ok" and run["exit_code"] == 0
    assert 0.3 <= run["eager_s"] < run["wall_s"]  # the eager line came before the end
    assert run["wall_s"] >= 0.8
    assert run["advise_command"] == ("advisor advise tests/data/tiny_cnn.py --mode train "
                                     "--device cpu --effort quick --storage memory --out "
                                     "cfg.json")  # fmt: skip
    assert run["pick"] == "memory_format=channels_last, amp=bf16"
    assert run["claimed_speedup"] == 1.5 and run["claimed_ci"] == [1.4, 1.6]
    assert run["final_check"] == {"where": "fresh process", "speedup": 1.4,
                                  "speedup_ci": [1.3, 1.5], "rounds": 20, "held": True}  # fmt: skip
    assert run["harness_share"] == pytest.approx(0.75)  # 0.5 s timed of 2.0 s
    assert run["harness_share_gate_apart"] == pytest.approx(1 - 0.5 / 1.5)
    assert run["effort_run"] == "quick" and run["trials"] == 3 and run["notes"] == ["a note"]
    # the tree's modules were compiled before the clock started, as an install compiles them
    assert list((tree / "advisor" / "__pycache__").glob("unused.*.pyc"))


def test_a_run_past_its_limit_gets_ctrl_c_and_keeps_the_answer_it_wrote(
    tree: Path, tmp_path: Path
) -> None:
    run = advise(TINY, "train", "default", "cpu", limit_s=2, work=tmp_path, tree=tree,
                 env={"FAKE_ADVISOR": "hang"}, log=lambda _: None)  # fmt: skip
    assert run["status"] == "stopped at its limit (2 s)" and run["exit_code"] == 130
    assert 2 <= run["stopped_s"] <= run["wall_s"] < 30  # Ctrl-C, not the 60 s sleep
    assert run["answer"] == "eager" and run["pick"] == "memory_format=channels_last, amp=bf16"


def test_a_failed_run_says_why_in_its_last_line(tree: Path, tmp_path: Path) -> None:
    run = advise(TINY, "train", "quick", "cpu", limit_s=60, work=tmp_path, tree=tree,
                 env={"FAKE_ADVISOR": "fail"}, log=lambda _: None)  # fmt: skip
    assert run["status"] == "failed: advisor: error: cannot build the model"
    assert run["exit_code"] == 2 and "pick" not in run


def test_the_adapter_reads_a_config_without_a_result_as_nothing_measured() -> None:
    got = row_from_config({"settings": {"memory_format": "contiguous"}})
    assert got["pick"] == "default" and got["claimed_speedup"] is None
    assert got["harness_share"] is None and got["final_check"] is None and got["notes"] == []


def test_a_pick_is_labelled_as_the_advisor_labels_it() -> None:
    assert label({}) == "default"
    assert label({"memory_format": "channels_last", "cudnn_benchmark": True,
                  "layers": {"a": "unfold_gemm", "b": "unfold_gemm"}}) == (
        "memory_format=channels_last, cudnn_benchmark=on, layers: 2x unfold_gemm")  # fmt: skip
    # a revision's setting this tree does not know: named as written, defaults left out
    assert label({"memory_format": "contiguous", "new_knob": "x"}) == "new_knob=x"


def test_the_deadline_is_shared_in_proportion_and_early_parts_leave_theirs_to_later_ones() -> None:
    assert plan.limit_for(530, 20, 400) == 130  # ahead of plan: the slack to the part running
    assert plan.limit_for(200, 20, 380) == pytest.approx(200 * 20 / 400)  # behind: its share
    assert plan.limit_for(0, 20, 100) == 0


def test_a_plan_appends_each_models_rows_once_its_last_part_ended(
    tree: Path, tmp_path: Path
) -> None:
    table = tmp_path / "runs.jsonl"
    other = Model("other", "tests/data/relu_bn_block.py", "x", modes=("train", "infer"))
    parts = [plan.Part("advise", TINY, "train", e, 1.0, tree=tree) for e in ("quick", "default")]
    parts.append(plan.Part("advise", other, "infer", "quick", 1.0, tree=tree))
    seen: list[int] = []

    def log(line: str) -> None:  # how many rows the table holds as each part starts
        if line.startswith("[benchmarks] other"):
            seen.append(len(read(table)))

    opts = plan.Options(command="python -m benchmarks test", table=table)
    rows = plan.run_plan(parts, opts, log)
    assert seen == [2]  # tiny's two rows were in the table before `other` ran
    assert [(r["model"], r["mode"], r["effort"]) for r in read(table)] == [
        ("tiny", "train", "quick"), ("tiny", "train", "default"), ("other", "infer", "quick")]
    for r in rows:
        assert all(k in r for k in KEY) and r["status"] == "ok" and r["source"] is None
        assert r["commit"] is None and r["dirty"] is None  # the stand-in's tree has no git
        assert r["command"] == "python -m benchmarks test" and r["env"]["device_type"] == "cpu"
        assert r["machine"].startswith("cpu-") and "worth" not in r
        assert r["wall_s"] > 0.8 and r["eager_s"] < r["wall_s"] and "config" not in r


def test_a_model_that_cannot_be_built_is_a_row_that_says_why(tmp_path: Path) -> None:
    broken = Model("broken", "tests/data/tiny_cnn.py", "x", needs=("no_such_package_here",))
    # with --samples too: the skipped run has no config to keep
    rows = plan.run_plan(plan.plan_for([broken], ["train"], ["quick"], True, "cpu"),
                         plan.Options(table=tmp_path / "t.jsonl", samples=tmp_path / "s"),
                         lambda _: None)  # fmt: skip
    (row,) = rows
    assert row["status"].startswith("skipped: needs no_such_package_here: ModuleNotFoundError")
    assert row["worth"]["error"].startswith("skipped: needs no_such_package_here")


def test_compares_plan_alternates_the_revisions_and_retimes_their_picks_together() -> None:
    trees = {"aaa": Path("/a"), "bbb": Path("/b")}
    parts = plan.compare_plan(trees, [TINY], None, ["quick"], 2, worth=True)
    assert [(p.kind, p.revision) for p in parts] == [
        ("advise", "aaa"), ("advise", "bbb"), ("advise", "bbb"), ("advise", "aaa"),
        ("worth", None)]  # fmt: skip
    assert [p.tree for p in parts[:2]] == [Path("/a"), Path("/b")]
    assert plan.pick_role(parts[0]) == "pick aaa quick"


def _worktrees() -> set[str]:
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, text=True,
                         capture_output=True, check=True).stdout  # fmt: skip
    return {ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("worktree ")}


def test_compare_checks_out_each_revision_and_removes_its_worktrees_however_it_ends() -> None:
    before = _worktrees()
    head = plan.resolve("HEAD")
    with pytest.raises(RuntimeError, match="inside"), plan.worktrees(["HEAD~1", "HEAD"]) as trees:
        assert list(trees) == [plan.resolve("HEAD~1"), head]
        for sha, path in trees.items():
            at = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=path, text=True,
                                capture_output=True, check=True).stdout.strip()  # fmt: skip
            assert at == sha and (path / "advisor" / "__init__.py").exists()
        raise RuntimeError("inside")
    assert _worktrees() == before and not any(p.exists() for p in trees.values())


@pytest.mark.parametrize("revs, message", [
    (["HEAD", "no-such-revision-here"], "unknown revision 'no-such-revision-here'"),
    (["HEAD", "HEAD"], "two revisions or more"),
])  # fmt: skip
def test_compare_refuses_revisions_it_cannot_compare(revs: list[str], message: str) -> None:
    before = _worktrees()
    with pytest.raises(UsageError, match=message), plan.worktrees(revs):
        pass
    assert _worktrees() == before
