"""`advisor --help` and `advisor advise --help`: the options grouped by purpose, in the order a
user decides them (workload, search, budget and effort, storage, output), each with its default."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from advisor.cli import build_parser, main
from advisor.cli_args import GROUPS

ORDER = ["workload", "search", "budget and effort", "storage", "output"]


def _sub(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _groups(p: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    return {g.title: g._group_actions for g in p._action_groups if g.title in GROUPS}


def test_advise_help_groups_its_options_by_purpose_in_order() -> None:
    p = _sub("advise")
    text = p.format_help()
    assert list(_groups(p)) == ORDER == list(GROUPS)
    at = [text.index(f"\n{title}:\n") for title in ORDER]
    assert at == sorted(at)
    groups = _groups(p)
    options = {o for a in groups["budget and effort"] for o in a.option_strings}
    assert {"--effort", "--budget", "--trials", "--trial-timeout"} <= options
    assert {"--storage", "--study-name", "--fresh"} <= {
        o for a in groups["storage"] for o in a.option_strings
    }
    assert {"--out", "--quiet", "--json"} <= {o for a in groups["output"] for o in a.option_strings}
    # every option but --help is in one of the groups
    grouped = {a.dest for actions in groups.values() for a in actions}
    assert {a.dest for a in p._actions if a.dest != "help"} == grouped


@pytest.mark.parametrize("command", ["advise", "worker", "env", "report"])
def test_each_help_line_says_its_default(command: str) -> None:
    p = _sub(command)
    for a in p._actions:
        if a.dest == "help" or (not a.option_strings and a.default is None and a.required):
            continue
        assert a.help and "(default: " in a.help, (command, a.dest, a.help)
        if a.default is False:  # a flag
            assert "(default: off" in a.help, (command, a.dest, a.help)
        elif a.default is not None:
            shown = f"{a.default:g}" if isinstance(a.default, float) else str(a.default)
            assert f"(default: {shown})" in a.help, (command, a.dest, a.help)


def test_the_worker_shares_the_workload_and_search_groups() -> None:
    advise, worker = _groups(_sub("advise")), _groups(_sub("worker"))
    assert list(worker) == ORDER[:4]
    for title, actions in worker.items():
        assert {a.dest for a in actions} <= {a.dest for a in advise[title]}, title
    assert [a.dest for a in worker["workload"]] == [a.dest for a in advise["workload"]]


def test_advisor_help_names_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "advise --help` lists its options by purpose: " + ", ".join(ORDER) in out


def test_the_command_freezes_what_it_imported_and_made_before_its_exit() -> None:
    """`advisor` (cli.run) leaves torch's objects and the run's to the exit, not to the garbage
    collector: at exit they are frozen. A caller of `main` keeps its collector as it was."""
    code = (
        "import atexit, gc, sys\n"
        "import advisor.cli\n"
        "advisor.cli.main(['schema'])\n"
        "after_main = gc.get_freeze_count()\n"
        "atexit.register(lambda: print(after_main, gc.get_freeze_count(), file=sys.stderr))\n"
        "sys.argv = ['advisor', 'schema']\n"
        "advisor.cli.run()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    after_main, at_exit = map(int, done.stderr.split()[-2:])
    assert after_main == 0
    assert at_exit > 50_000


@pytest.mark.parametrize("collecting", [True, False])
def test_importing_the_package_leaves_the_collector_as_it_was(collecting: bool) -> None:
    """The package imports torch with the garbage collector off (nothing it makes is garbage),
    then puts it back as the importer had it, nothing frozen: what the import made is in the
    oldest generation, where no young collection walks it."""
    code = (f"import gc\nif not {collecting}: gc.disable()\nimport advisor\n"
            "print(gc.isenabled(), gc.get_freeze_count(),"
            " len(gc.get_objects(0)) + len(gc.get_objects(1)), len(gc.get_objects(2)))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    enabled, frozen, young, old = done.stdout.split()
    assert (enabled, frozen) == (str(collecting), "0")
    assert int(old) > 50_000 > 20 * int(young)


def test_with_triton_loaded_the_command_exits_without_a_leak_report() -> None:
    """Triton's nanobind extension prints each of its objects still alive at the interpreter's
    teardown as a leak (dozens of lines after the run's last): `run` leaves without it."""
    code = "import sys, triton\nimport advisor.cli\nsys.argv = ['advisor', 'schema']\nadvisor.cli.run()\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
