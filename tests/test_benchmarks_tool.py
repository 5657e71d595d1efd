"""`python -m benchmarks`: bad input is one line and exit code 2; the registry and its sets; the
table (whole lines appended, a bad line named); the environment record on every row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import registry, table
from benchmarks.registry import ROOT, Model, UsageError
from tests.conftest import run_env


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=cwd, env=run_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("args, says", [
    ((), "the following arguments are required: COMMAND"),
    (("nope",), "invalid choice: 'nope'"),
    (("advise", "no_such_model"), "unknown model 'no_such_model'"),
    (("advise", "missing_file.py"), "model file not found: missing_file.py"),
    (("worth", "--set", "nope"), "invalid choice: 'nope'"),
    (("worth", "small_cnn", "--round-s", "0"), "--round-s: must be above 0: '0'"),
    (("advise",), "no models: name some, or a set"),
    (("compare", "HEAD", "--models", "small_cnn"), "compare needs two revisions or more"),
    (("compare", "HEAD", "not-a-rev-x", "--models", "small_cnn"), "unknown revision 'not-a-rev-x'"),
    (("compare", "HEAD", "HEAD~1", "--models", "small_cnn", "--repeats", "0"), "--repeats"),
    (("profile", "no_such_folder"), "not a folder: no_such_folder"),
    (("merge", "no_such_rows.jsonl"), "not a file: no_such_rows.jsonl"),
    (("gates", "nope"), "invalid choice: 'nope'"),
    (("gates", "verdicts", "--seeds", "x"), "--seeds: invalid int value: 'x'"),
])  # fmt: skip
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(args: tuple[str, ...], says: str) -> None:
    r = _cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("benchmarks"), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_a_table_with_a_bad_line_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps(_row()) + "\n{not json\n")
    target = tmp_path / "table.jsonl"
    r = _cli("merge", str(bad), "--table", str(target))
    assert r.returncode == 2 and f"{bad}:2: not a row of the table" in r.stderr
    assert not target.exists()  # no half-written table
    r = _cli("page", "--check", "--table", str(bad))
    assert r.returncode == 2 and "not a row of the table" in r.stderr


def test_a_row_naming_a_commit_this_repository_lacks_is_refused(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    target = tmp_path / "table.jsonl"
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=True).stdout.strip()  # fmt: skip
    rows.write_text(json.dumps(_row(commit=head)) + "\n" + json.dumps(_row(commit="993ef7335a")) + "\n")
    r = _cli("merge", str(rows), "--table", str(target))
    assert r.returncode == 2 and "commit 993ef7335a, which this repository does not have" in r.stderr
    assert not target.exists()  # none of the file's rows
    rows.write_text(json.dumps(_row(commit=head)) + "\n")
    r = _cli("merge", str(rows), "--table", str(target))
    assert r.returncode == 0 and [x["commit"] for x in table.read(target)] == [head]


def test_list_names_every_set_and_model() -> None:
    r = _cli("list")
    assert r.returncode == 0
    for name in registry.SETS:
        assert f"{name}: " in r.stdout
    assert all(m.name in r.stdout for m in registry.MODELS)


# ======================================================================== the registry


def test_sets_name_registry_models_and_every_model_file_exists() -> None:
    for members in registry.SETS.values():
        assert all(n in registry.BY_NAME for n in members)
    for m in registry.MODELS:
        assert m.path.is_file(), m.file
    assert len(registry.SETS["zoo"]) == 6 and registry.SETS["gpu"][0] == "small_cnn"


def test_select_takes_names_globs_sets_and_files_once_each(tmp_path: Path) -> None:
    got = registry.select(["tv_r*", "small_cnn", str(ROOT / "tests/data/tiny_cnn.py")], ["gpu"])
    assert [m.name for m in got] == ["small_cnn", "tv_resnet50", "tv_r2plus1d_18", "tiny_cnn"]
    assert got[-1].path == ROOT / "tests/data/tiny_cnn.py"
    with pytest.raises(UsageError, match="unknown set"):
        registry.select(None, ["nope"])


def test_a_seed_is_the_seeds_own_size_on_a_gpu() -> None:
    seed = registry.BY_NAME["seed_dwconvT_bn"]
    assert seed.target("cpu")[1:] == ["--build", "build_dwconvT_bn", "--inputs", "inputs_dwconvT_bn"]
    assert seed.target("cuda")[1:] == ["--build", "build_dwconvT_bn_full", "--inputs",
                                       "inputs_dwconvT_bn_full"]  # fmt: skip
    assert registry.BY_NAME["resnet18"].target("cuda") == ["benchmarks/models/resnet18.py"]


def test_a_package_that_raises_at_import_is_why_a_model_is_missing(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    (tmp_path / "broken_vision.py").write_text("raise RuntimeError('operator x::nms does not exist')")
    monkeypatch.syspath_prepend(str(tmp_path))
    m = Model("m", "tests/data/tiny_cnn.py", "x", needs=("broken_vision",))
    assert m.missing() == "needs broken_vision: RuntimeError: operator x::nms does not exist"
    assert Model("m", "tests/data/tiny_cnn.py", "x", needs=("json",)).missing() is None


# ======================================================================== the table


def _row(**kw: object) -> dict[str, object]:
    return {"schema": table.SCHEMA, "machine": "cpu-x-2t-abc", "commit": "abc", "model": "m",
            "mode": "train", "effort": "quick", "env": {}, "dirty": False, "date": "2026-01-01",
            "command": "c", "status": "ok", **kw}  # fmt: skip


def test_rows_are_appended_as_whole_lines_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    table.append([_row(wall_s=1.5)], path)
    with path.open("a") as f:
        f.write(json.dumps(_row(wall_s=2.5)))  # a line someone left unterminated
    table.append([_row(wall_s=3.5), _row(wall_s=4.5)], path)
    assert [r["wall_s"] for r in table.read(path)] == [1.5, 2.5, 3.5, 4.5]
    assert path.read_text().endswith("\n") and path.read_text().count("\n") == 4
    assert table.read(tmp_path / "none.jsonl") == []


def test_a_row_without_its_keys_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    bad = _row()
    del bad["effort"]
    with pytest.raises(ValueError, match="lacks effort"):
        table.append([_row(), bad], path)
    assert not path.exists()
    with pytest.raises(ValueError, match="schema 0"):
        table.validate(_row(schema=0))


def test_latest_is_the_newest_row_of_each_key() -> None:
    rows = [_row(date="2026-01-02", wall_s=2), _row(date="2026-01-01", wall_s=1),
            _row(date="2026-01-03", effort="default", wall_s=3)]  # fmt: skip
    got = table.latest(rows)
    assert got[("cpu-x-2t-abc", "m", "train", "quick")]["wall_s"] == 2 and len(got) == 2


def test_the_environment_record_names_the_machine_its_libraries_and_commit() -> None:
    env = table.environment("cpu")
    for key in ("fingerprint", "cpu_model", "cpu_capability", "torch_threads", "logical_cpus",
                "torch", "python", "bf16_units"):  # fmt: skip
        assert env.get(key) is not None, key
    assert env["libraries"]["torch"] == env["torch"] and "optuna" in env["libraries"]
    machine = table.machine_id(env)
    assert machine.startswith("cpu-") and f"-{env['torch_threads']}t-" in machine
    # the same hardware with other libraries is the same machine; other threads are not
    assert table.machine_id({**env, "torch": "9.9", "libraries": {}}) == machine
    assert table.machine_id({**env, "torch_threads": 99}) != machine
    sha, dirty = table.git_state()
    assert sha and len(sha) == 10 and isinstance(dirty, bool)


def test_a_cpu_name_becomes_a_short_slug() -> None:
    assert table.slug("Intel(R) Xeon(R) Processor (family 6 model 207)") == "intel-xeon-f6m207"
    assert table.slug("AMD EPYC 9654 96-Core Processor") == "amd-epyc-9654-96-core"
    # the clock after '@' goes, the family and model after it stay
    at = "Intel(R) Xeon(R) Processor @ 2.80GHz (family 6 model 106)"
    assert table.slug(at) == "intel-xeon-f6m106"
