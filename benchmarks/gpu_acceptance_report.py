"""gpu_acceptance.py's report: issue 55's targets checked, and one table per advise run.

Pure functions of the run's record (its JSON), so a record can be rendered again and tested
without a GPU: `evaluate(data)` checks the targets, `render(data)` writes the markdown.

Targets (issue 55, train mode, on an H100/H200):
- quick: small_cnn <= 20 s, ResNet-50 <= 45 s, the video network <= 45 s; harness <= 60%, the
  numeric gate's checks counted apart (decided in issue 40);
- default: small_cnn <= 90 s, ResNet-50 <= 180 s, each ending on its own, not on its budget;
- each pick at least as fast as PyTorch's default and as the hand setting in the fresh-process
  re-time, within noise: the paired per-round ratio's 95% interval reaches 1.0x or above;
  where the hand setting is slower than the default beyond noise, a note says so.
"""

from __future__ import annotations

from typing import Any

from advisor.measure.stats import Measurement, paired_speedup
from advisor.stages.walltime import breakdown_line, harness_share

HARNESS_TARGET = 0.60
ROLES = (("default", "PyTorch's default"), ("pick", "the pick"),
         ("hand", "hand setting"), ("compile", "torch.compile"))  # fmt: skip


# ======================================================================== the figures


def shares(run: dict[str, Any]) -> tuple[float | None, float | None]:
    """The run's harness share, and the same with the gate's checks counted apart
    (advisor.stages.walltime.harness_share, as advise_walltime.py reads a config's stage_s)."""
    stage_s = run.get("stage_s") or {}
    return harness_share(stage_s), harness_share(stage_s, gate_apart=True)


def budget_end(run: dict[str, Any]) -> str | None:
    """Why the run did not end on its own (None: it did): this script stopped it, or the
    advice says its budget ran out (advisor.stages.budget's notes, a precision check, a trial)."""
    if "stopped_s" in run:
        return f"stopped by this script at {run['stopped_s']:.0f} s (its share of the deadline)"
    said = [t for t in (run.get("notes") or []) + (run.get("precisions") or [])
            if "budget ran out" in t] + list(run.get("budget_reasons") or [])  # fmt: skip
    return said[0] if said else None


def entry(rt: dict[str, Any] | None, role: str) -> dict[str, Any] | None:
    """The re-time's row for `role` ("default", "pick quick", "hand", "compile")."""
    if not rt or role not in rt.get("roles", {}):
        return None
    got = rt["result"].get(rt["roles"][role])
    return got if isinstance(got, dict) else None


def paired(base: dict[str, Any] | None, other: dict[str, Any] | None) -> tuple[float, ...] | None:
    """base time / other time per interleaved round: median and 95% interval (above 1.0x:
    `other` is faster); None where either was not timed."""
    if not base or not other or not base.get("samples_ms") or not other.get("samples_ms"):
        return None
    try:
        return paired_speedup(Measurement(samples_ms=base["samples_ms"]),
                              Measurement(samples_ms=other["samples_ms"]))  # fmt: skip
    except ValueError:
        return None


def _x(s: tuple[float, ...] | None) -> str:
    return "-" if s is None else f"{s[0]:.2f}x [{s[1]:.2f}, {s[2]:.2f}]"


def _check(run: str, target: str, value: str, met: bool | None) -> dict[str, Any]:
    return {"run": run, "target": target, "value": value, "met": met}


def evaluate(data: dict[str, Any]) -> dict[str, list[Any]]:
    """Every target of the issue that the record can answer, each met, missed or unknown
    (None: not measured), and the notes the issue asks for."""
    checks: list[dict[str, Any]] = []
    notes: list[str] = []
    for run in data["runs"]:
        name = f"{run['model']} {run['effort']}"
        rt = data["retimes"].get(run["model"])
        if run.get("target_s") is not None:
            wall = run.get("wall_s")
            met = None if wall is None else wall <= run["target_s"] and "stopped_s" not in run
            checks.append(_check(name, f"wall <= {run['target_s']:g} s",
                                 "not run" if wall is None else f"{wall:.1f} s", met))  # fmt: skip
        if run["effort"] == "quick":
            share = shares(run)[1]
            checks.append(_check(name, f"harness <= {HARNESS_TARGET:.0%} (gate apart)",
                                 "-" if share is None else f"{share:.0%}",
                                 None if share is None else share <= HARNESS_TARGET))  # fmt: skip
        if run["effort"] == "default":
            why = budget_end(run)
            ran = "wall_s" in run and "error" not in run
            checks.append(_check(name, "ends on its own", why or ("yes" if ran else "not run"),
                                 (why is None) if ran else None))  # fmt: skip
        pick = entry(rt, f"pick {run['effort']}")
        for role, what in (("default", "PyTorch's default"), ("hand", "the hand setting")):
            base = entry(rt, role)
            same = rt is not None and rt["roles"].get(role) == rt["roles"].get(
                f"pick {run['effort']}"
            )
            s = paired(base, pick)
            value = f"the same setting as {what}" if same and pick else _x(s)
            met = True if same and pick else (None if s is None else s[2] >= 1.0)
            checks.append(_check(name, f"pick as fast as {what} (re-time)", value, met))
    for model, rt in data["retimes"].items():
        s = paired(entry(rt, "default"), entry(rt, "hand"))
        if s is not None and s[2] < 1.0:
            d, h = entry(rt, "default"), entry(rt, "hand")
            assert d is not None and h is not None
            notes.append(f"{model}: the hand setting is slower than PyTorch's default "
                         f"({h['median_ms']:.3g} against {d['median_ms']:.3g} ms a step; "
                         f"default/hand {_x(s)})")  # fmt: skip
    return {"checks": checks, "notes": notes}


# ======================================================================== the markdown


def _final_check(fc: dict[str, Any] | None) -> str:
    if not fc:
        return "none"
    lo, hi = fc["speedup_ci"]
    verdict = "held" if fc["held"] else "did not hold"
    return f"{fc['speedup']:.2f}x [{lo:.2f}, {hi:.2f}] over {fc['rounds']} rounds in {fc['where']}: {verdict}"


def _ms(e: dict[str, Any] | None, key: str) -> str:
    return f"{e[key]:.3g}" if e and isinstance(e.get(key), float) else "-"


def _first(e: dict[str, Any], cuda: bool) -> str:
    """The first call, with the one-time cost it carries named."""
    if "first_call_s" not in e:
        return "-"
    label = str(e.get("label", ""))
    what = [w for w, there in (("cold compile", "compile" in label),
                               ("cuDNN's search", cuda and "cudnn_benchmark=on" in label)) if there]  # fmt: skip
    return f"{e['first_call_s']:.2f}" + (f" ({', '.join(what)})" if what else "")


def _retime_table(data: dict[str, Any], run: dict[str, Any]) -> list[str]:
    rt = data["retimes"].get(run["model"])
    if rt is None:
        return ["No re-time of this model (not reached before the deadline, or left out)."]
    pick_role = f"pick {run['effort']}"
    pick = entry(rt, pick_role)
    res = rt["result"]
    lines = [f"Re-timed in fresh processes, a process per setting, {res.get('rounds', 0)} "
             f"interleaved rounds ({rt['seconds']:.0f} s of its {rt['limit_s']:.0f} s share; "
             "the model's runs share these processes):", "",
             "| variant | settings | process | set-up s | first call s | median ms | IQR ms "
             "| 95% CI ms | default / it (paired) | it / pick (paired) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    default = entry(rt, "default")
    cuda = data["environment"].get("device_type") == "cuda"
    for role, what in ROLES:
        key = pick_role if role == "pick" else role
        if key not in rt["roles"]:
            continue
        proc = rt["roles"][key]
        e = res.get(proc) or {}
        settings = e.get("label") or "-"
        if "error" in e:
            lines.append(f"| {what} | {settings} | {proc} | - | - | {e['error']} | | | | |")
            continue
        lines.append(
            f"| {what} | {settings} | {proc} | {_ms(e, 'ready_s')} | {_first(e, cuda)} "
            f"| {_ms(e, 'median_ms')} | {_ms(e, 'iqr_ms')} "
            f"| {_ms(e, 'ci_low_ms')}-{_ms(e, 'ci_high_ms')} | {_x(paired(default, e))} "
            f"| {_x(paired(e, pick))} |"
        )
    return lines


def _run_section(data: dict[str, Any], run: dict[str, Any]) -> list[str]:
    lines = ["", f"## {run['model']}, --effort {run['effort']}", "", f"`{run.get('command', '-')}`",
             ""]  # fmt: skip
    if "error" in run and "wall_s" not in run:  # skipped, or not reached before the deadline
        return [*lines, f"Not measured: {run['error']}."]
    share, apart = shares(run)
    ended = budget_end(run) or "on its own"
    if "error" in run:
        ended = run["error"]
    pct = "-" if share is None else f"{share:.0%}"
    pct_apart = "-" if apart is None else f"{apart:.0%}"
    target = f"{run['target_s']:g}" if run.get("target_s") is not None else "-"
    lines += ["| wall s | target s | harness | harness, gate apart | pick | final check | ended |",
              "| ---: | ---: | ---: | ---: | --- | --- | --- |",
              f"| {run['wall_s']:.1f} | {target} | {pct} | {pct_apart} | `{run.get('pick', '-')}` "
              f"| {_final_check(run.get('final_check'))} | {ended} |", ""]  # fmt: skip
    if run.get("stage_s"):
        lines.append(f"Time: {breakdown_line(run['stage_s'])}.")
    for text in run.get("precisions") or []:
        lines.append(f"Precision: {text}")
    if run.get("bf16_trials"):
        counts = ", ".join(f"{n} {s}" for s, n in sorted(run["bf16_trials"].items()))
        lines.append(f"bf16 candidates: {counts}.")
    for key in ("benchmark_note", "compile_note", "payback"):
        if run.get(key):
            lines.append(f"{key.replace('_', ' ').capitalize()}: {run[key]}")
    for text in run.get("notes") or []:
        lines.append(f"Note: {text}")
    lines += ["", *_retime_table(data, run), ""]
    name = f"{run['model']} {run['effort']}"
    verdicts = data.get("targets") or evaluate(data)
    met = {True: "met", False: "**missed**", None: "not measured"}
    return [*lines, "Targets: " + "; ".join(
        f"{c['target']}: {c['value']}, {met[c['met']]}" for c in verdicts["checks"]
        if c["run"] == name) + "."]  # fmt: skip


def render(data: dict[str, Any]) -> str:
    env = data["environment"]
    gpu = (
        env.get("device_name")
        if env.get("device_type") == "cuda"
        else f"CPU {env.get('cpu_model')}"
    )
    lines = [
        f"# Issue 55's acceptance: {gpu}",
        "",
        "| device | capability | memory GB | driver | CUDA | cuDNN | torch | Triton | Python "
        "| date | commit |",
        "| --- | --- | ---: | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {gpu} | {env.get('capability')} | {env.get('device_memory_gb')} | {env.get('driver')} "
        f"| {env.get('cuda')} | {env.get('cudnn')} | {env.get('torch')} | {env.get('triton')} "
        f"| {env.get('python')} | {data['date']} | {data['commit']} |",
        "",
        f"Command: `{data['command']}`; {data.get('seconds', 0):.0f} s in all, deadline "
        f"{data['deadline_s']:.0f} s. Each advise run is `advisor advise` in its own process, "
        "timed end to end (Python's start-up included), with fresh compile and advisor caches "
        "for the whole script. Harness: the run's wall time outside the candidates' timed "
        "samples (the advisor's own breakdown), and the same with the numeric gate's checks "
        "counted apart. Re-time: each setting in a fresh process of its own with empty compile "
        "caches (benchmarks/process_retime.py); first call = its first training step there "
        "(torch.compile's cold compile, cuDNN's search under cudnn.benchmark); rounds of one "
        f"sample each in alternating order, {data['round_s']:g} s a setting; ratios are paired "
        "by round (median of per-round ratios, 95% interval). Hand setting: channels_last + "
        "bf16 autocast + cudnn.benchmark. torch.compile: default mode on the untouched model.",
        "",
        "## Targets",
        "",
        "| run | target | value | met |",
        "| --- | --- | --- | --- |",
    ]
    verdicts = data.get("targets") or evaluate(data)
    for c in verdicts["checks"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[c["met"]]
        lines.append(f"| {c['run']} | {c['target']} | {c['value']} | {met} |")
    lines += ["", *(f"- {n}" for n in verdicts["notes"])]
    bf16 = [f"- {r['model']} {r['effort']}: {t}" for r in data["runs"]
            if "resnet50" in r["model"] for t in r.get("precisions") or [] if "bf16" in t]  # fmt: skip
    if bf16:
        lines += ["", "bf16 on ResNet-50 (issue 56 asks that it be accepted at 32 x 224²):", *bf16]
    for run in data["runs"]:
        lines += _run_section(data, run)
    lines += [
        "",
        "## Parts",
        "",
        "| part | share s | ended at s | result |",
        "| --- | ---: | ---: | --- |",
    ]
    for p in data["parts"]:
        lines.append(
            f"| {p['part']} | {p['limit_s']:.0f} | {p.get('seconds', 0):.0f} | {p['status']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Render a record again (after a change to this report): the .md beside its .json."""
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path, help="a gpu_acceptance_<gpu>.json")
    args = ap.parse_args(argv)
    data = json.loads(args.record.read_text())
    data["targets"] = evaluate(data)
    args.record.with_suffix(".md").write_text(render(data))
    args.record.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
