"""One-off: the result files of the scripts before `python -m benchmarks`, imported into the
table (benchmarks/results/runs.jsonl). Run once, then deleted with the files it read (git keeps
both): `python -m benchmarks.legacy`.

Each row names its source file and the commit that added it (`source`); its `commit` is the
run's own where the file recorded it (a revision column, a `commit` field, a `--commit`),
else the commit that added the file (the run was at it or before it), and `source.commit_is`
says which. Its machine is what the file recorded; where a VM named only "AMD EPYC" or
"Intel Xeon", the family and model numbers other files of the same name's tag record
(`epyc_zen4`: family 25 model 17) are added, and `source.machine` says so.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import retime
from benchmarks.registry import ROOT
from benchmarks.runner import label, row_from_config
from benchmarks.table import SCHEMA, TABLE, append, machine_id

RESULTS = ROOT / "benchmarks" / "results"
# The family and model numbers that the files of a tag record elsewhere
TAGS = {"epyc_zen3": "AMD EPYC (family 25 model 1)", "zen3": "AMD EPYC (family 25 model 1)",
        "epyc_zen4": "AMD EPYC (family 25 model 17)", "zen4": "AMD EPYC (family 25 model 17)",
        "epyc_zen5": "AMD EPYC (family 26 model 2)",
        "xeon_emr": "Intel(R) Xeon(R) Processor (family 6 model 207)"}  # fmt: skip
MACHINE = re.compile(r"Machine: (?P<name>.+?) \((?P<dev>cpu|cuda), (?P<cap>[^)]*)\), "
                     r"(?P<threads>\d+) threads; torch (?P<torch>[^;]+); Python (?P<py>[^;]+); "
                     r"(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d)?")  # fmt: skip
ZOO_FILES = {"resnet18": "benchmarks/models/resnet18.py", "small_cnn": "advisor/examples/small_cnn.py"}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def added(path: Path) -> tuple[str, str]:
    """The commit that added the file, and its date."""
    out = git("log", "--diff-filter=A", "--format=%h %cI", "--", str(path.relative_to(ROOT)))
    sha, date = out.splitlines()[-1].split()
    return sha, date


def tag_of(path: Path) -> str | None:
    stem = path.stem.removesuffix(".trials")
    for tag in sorted(TAGS, key=len, reverse=True):
        if f"_{tag}" in stem:
            return tag
    return None


def env_from_line(line: str, path: Path) -> tuple[dict[str, Any], str]:
    """The environment a script's machine line recorded, and the run's date."""
    m = MACHINE.search(line)
    if m is None:
        raise ValueError(f"{path.name}: no machine line: {line[:80]}")
    env = env_of(m["name"], m["dev"], m["cap"], int(m["threads"]), m["torch"], m["py"], path)
    if m["date"]:
        return env, m["date"].replace(" ", "T") + ":00+00:00"
    return env, added(path)[1]  # no date recorded: the commit's that added the file


def env_of(name: str, dev: str, cap: str, threads: int, torch: str | None, py: str | None,
           path: Path, **more: Any) -> dict[str, Any]:  # fmt: skip
    env: dict[str, Any] = {"device_type": dev, "cpu_threads": threads, "torch_threads": threads,
                           "torch": torch, "python": py, **more}  # fmt: skip
    if dev == "cuda":
        env.update(device_name=name, capability=cap)
    else:
        tag = tag_of(path)
        cpu = name
        if "family" not in name and tag and TAGS[tag].startswith(name.split(" (")[0]):
            cpu = TAGS[tag]
            env["machine_from"] = f"the file name's tag {tag}"
        env.update(device_name=name, cpu_model=cpu, capability=cap, cpu_capability=cap)
    return env


def legacy_machine(env: dict[str, Any]) -> str:
    """machine_id of what the file recorded: no logical CPU count (most files lack it); on a
    GPU the GPU and the threads alone (few files named the host's CPU)."""
    if env.get("device_type") == "cuda":
        return machine_id({**env, "cpu_model": None, "cpu_capability": None, "logical_cpus": None,
                           "device_memory_gb": None})
    return machine_id({**env, "logical_cpus": None})


def base(path: Path, env: dict[str, Any], date: str, command: str, model: str, mode: str,
         effort: str, commit: str | None = None, **fields: Any) -> dict[str, Any]:  # fmt: skip
    sha, _ = added(path)
    source = {"file": str(path.relative_to(ROOT)), "commit": sha,
              "commit_is": "the run's, as the file recorded it" if commit else
              "the commit that added the file (the run was at it or before)"}  # fmt: skip
    if env.get("machine_from"):
        source["machine"] = env.pop("machine_from")
    row = {"schema": SCHEMA, "machine": legacy_machine(env), "commit": commit or sha,
           "dirty": None, "model": model, "mode": mode, "effort": effort, "date": date,
           "device": env.get("device_type"), "command": command, "env": env, "status": "ok",
           "target_s": None, **fields, "source": source}  # fmt: skip
    return row


def _model(name: str) -> str:
    return Path(name).stem if name.endswith(".py") else name


def _arg(argv: list[str], flag: str, default: str | None = None) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else default


def _config_fields(run: dict[str, Any]) -> dict[str, Any]:
    """The fields row_from_config gives, from a run the old scripts kept (settings, and the
    config's result or the fields they copied from it)."""
    res = run.get("result") or {k: run.get(k) for k in ("stage_s", "notes")}
    if "speedup" in run:
        res = {**res, "speedup": run["speedup"], "speedup_ci": run.get("speedup_ci")}
    got = row_from_config({"settings": run.get("settings") or {}, "result": res})
    if not run.get("settings"):
        got.update(settings=None, pick=run.get("pick"))
    fc = run.get("final_check")
    if isinstance(fc, bool):  # effort_levels kept whether it held, not the figures
        got["final_check"] = {"where": None, "speedup": None, "speedup_ci": None, "rounds": None,
                              "held": fc}  # fmt: skip
    elif isinstance(fc, dict):
        got["final_check"] = {k: fc.get(k) for k in ("where", "speedup", "speedup_ci", "rounds",
                                                      "held")}  # fmt: skip
    return {k: v for k, v in got.items() if k != "effort_run"}


def _status(run: dict[str, Any]) -> str:
    if run.get("stopped_s") is not None:
        return f"stopped at its limit ({run['stopped_s']:.0f} s)" + (
            "" if run.get("settings") else ": no answer written")
    if "error" in run:
        return f"failed: {run['error']}"
    return "ok"


# ======================================================================== the schemas


def advise_walltime(path: Path, d: dict[str, Any]) -> list[dict[str, Any]]:
    """{command, machine, revisions, rows: model -> sha -> [runs]}: every run a row, at its
    revision."""
    env, date = env_from_line(d["machine"], path)
    argv = d["command"].split()
    mode = _arg(argv, "--mode", "train")
    effort = _arg(argv, "--effort", "default")
    rows = []
    for model, by_rev in d["rows"].items():
        for sha, runs in by_rev.items():
            for run in runs:
                rows.append(base(path, dict(env), date, d["command"], _model(model), mode,
                                 effort, sha, status=_status(run), wall_s=run.get("wall_s"),
                                 **_config_fields(run)))  # fmt: skip
    return rows


def effort_levels(path: Path, d: dict[str, Any]) -> list[dict[str, Any]]:
    """{argv, machine, rows, reuse, after_quick}: a row per run; the runs with the default
    storage (a second run that reused the first; default after quick) say so in `storage`."""
    env, date = env_from_line(d["machine"], path)
    argv = d["argv"]
    md = path.with_suffix(".md")
    title = md.read_text().splitlines()[0] if md.exists() else ""
    found = re.search(r"advisor advise (\S+)", title)
    model = _model(found[1] if found else _arg(argv, "--model", "small_cnn.py") or "")
    mode = _arg(argv, "--mode", "train")
    command = "python benchmarks/effort_levels.py " + " ".join(argv)
    rows = []
    for group, storage in (("rows", None), ("reuse", "default: the run before, reused"),
                           ("after_quick", "default: quick's run, then this one")):  # fmt: skip
        for run in d.get(group) or []:
            extra = {"storage": storage} if storage else {}
            rows.append(base(path, dict(env), date, command, model, mode, run["effort"],
                             status=_status(run), wall_s=run.get("wall_s"),
                             eager_s=run.get("eager_s"), **_config_fields(run), **extra))  # fmt: skip
    return rows


def gpu_acceptance(path: Path, d: dict[str, Any]) -> list[dict[str, Any]]:
    """The H200 acceptance record: advise runs and the process-per-setting re-times."""
    e = d["environment"]
    env = {**e, "cpu_capability": None}
    rows = []
    for run in d["runs"]:
        rt = d["retimes"].get(run["model"])
        worth = None
        if rt is not None:
            res = rt["result"]
            of = {("pick " + r.split(" ", 1)[1] if r.startswith("pick") else r): p
                  for r, p in rt["roles"].items()}  # fmt: skip
            entries = {p: v for p, v in res.items() if isinstance(v, dict)}
            worth = {**retime.figures({"rounds": res.get("rounds", 0), "of": of,
                                       "entries": entries}, "cuda"),
                     "round_s": d["round_s"], "seconds": rt["seconds"], "limit_s": rt["limit_s"],
                     "method": "a process per setting, interleaved (process_retime)",
                     "pick_role": f"pick {run['effort']}"}  # fmt: skip
        status = "skipped: " + run["error"] if "wall_s" not in run and "error" in run else _status(run)
        fields = _config_fields(run) if run.get("settings") else {"pick": None}
        rows.append(base(path, dict(env), d["date"], d["command"], run["model"], "train",
                         run["effort"], d["commit"], status=status, wall_s=run.get("wall_s"),
                         stopped_s=run.get("stopped_s"), limit_s=run.get("limit_s"),
                         exit_code=run.get("exit_code"), target_s=run.get("target_s"),
                         advise_command=run.get("command"), worth=worth, **fields))  # fmt: skip
    from benchmarks.gpu import targets

    for r in rows:
        r["targets"] = targets(r)
    return rows


def gpu_check(path: Path, d: dict[str, Any]) -> list[dict[str, Any]]:
    """gpu_check's first step is an advise run (small_cnn, train, default effort, --budget 60):
    its wall time and the stages its output printed."""
    e = d["environment"]
    env = env_of(e["gpu"], "cuda", e["capability"], 16, e["torch"], e["python"], path,
                 device_memory_gb=e["memory_gb"], driver=e["driver"], cuda=e["cuda"],
                 cudnn=str(e["cudnn"]), triton=e["triton"])  # fmt: skip
    step = d["steps"][0]
    stages = {m[1]: float(m[2]) for m in re.finditer(r"^(\S[^:\n]*): done in ([\d.]+) s$",
                                                     step["stderr"], re.M)}  # fmt: skip
    date = d["date"].replace(" UTC", "").replace(" ", "T") + ":00+00:00"
    return [base(path, env, date, d["command"], "small_cnn", "train", "default",
                 status="ok" if step["status"] == "ok" else step["status"],
                 wall_s=float(step["seconds"]), stage_s=stages or None,
                 advise_command="advisor advise advisor/examples/small_cnn.py --device cuda "
                 "--mode train --budget 60 --storage memory", pick=None,
                 notes=["16 threads: the lent machine's CPU count (the record gives none)"])]  # fmt: skip


def _worth_one_process(retimed: dict[str, Any], roles: dict[str, str], device: str,
                       pick_role: str) -> dict[str, Any]:  # fmt: skip
    """A re-time of the zoo's kind (every setting in one fresh process, interleaved, paired by
    round); `plain`, in a process of its own, is not paired: its ratio is from both medians'
    intervals (advisor.measure.stats.speedup)."""
    from advisor.measure.stats import Measurement, speedup

    of = {role: name for role, name in roles.items() if name in retimed}
    entries = {}
    for name, v in retimed.items():
        e = dict(v)
        if "compile_s" in e:  # the rival's cold compile was its first call
            e["first_call_s"] = e["compile_s"]
        entries[name] = e
    paired = {k: v for k, v in of.items() if k != "plain"}
    got = retime.figures({"rounds": 0, "of": paired, "entries": entries}, device)
    got["rounds"] = min((len(entries[n].get("samples_ms") or []) for n in paired.values()),
                        default=0)  # fmt: skip
    if "plain" in of and entries["plain"].get("samples_ms") and "default" in of:
        p, d = entries["plain"], entries[of["default"]]
        if d.get("samples_ms"):
            m = Measurement(samples_ms=p["samples_ms"])
            got["roles"]["plain"] = {"label": "the untouched model, no advisor.apply",
                                     "process": "plain", "median_ms": round(m.median_ms, 5),
                                     "ci_ms": [round(m.ci_low_ms, 5), round(m.ci_high_ms, 5)],
                                     "paired": False}  # fmt: skip
            got["vs_default"]["plain"] = [round(x, 4) for x in speedup(
                Measurement(samples_ms=d["samples_ms"]), m)]
    got["method"] = ("one fresh process for all settings, interleaved (fresh_retime); plain in a "
                     "process of its own, unpaired")  # fmt: skip
    got["pick_role"] = pick_role
    return got


def zoo(path: Path, d: dict[str, Any]) -> list[dict[str, Any]]:
    e = d["environment"]
    env = env_of(e.get("cpu_model") or e["device_name"], e["device_type"], e.get("capability"),
                 e.get("torch_threads") or e["cpu_threads"], e.get("torch"), e.get("python"),
                 path, fingerprint=e.get("fingerprint"), platform=e.get("platform"),
                 logical_cpus=e.get("logical_cpus"))  # fmt: skip
    rows = []
    for r in d["rows"]:
        adv = r.get("advise") or {}
        if r.get("skipped"):
            rows.append(base(path, dict(env), d["date"], d["command"], r["model"], r["mode"],
                             "default", status=f"skipped: {r['skipped']}"))  # fmt: skip
            continue
        worth = None
        if r.get("retime"):
            roles = {"default": "default", "pick": "pick", "everything on": "everything_on",
                     "compile": "compile", "plain": "plain"}  # fmt: skip
            worth = _worth_one_process(r["retime"], roles, env["device_type"], "pick")
        elif r.get("retime_error"):
            worth = {"error": r["retime_error"]}
        fields = {"settings": adv.get("settings"), "pick": label(adv["settings"])
                  if adv.get("settings") else None, "claimed_speedup": adv.get("claimed_speedup"),
                  "claimed_ci": adv.get("claimed_speedup_ci"), "why": adv.get("why"),
                  "trials": adv.get("trials"), "rejected": adv.get("rejected"),
                  "tuning_s": adv.get("tuning_s"), "other_load": adv.get("other_load"),
                  "notes": adv.get("notes") or [], "compile_note": adv.get("compile_note"),
                  "final_check": _config_fields(adv)["final_check"]}  # fmt: skip
        rows.append(base(path, dict(env), d["date"], d["command"], r["model"], r["mode"],
                         "default", status=_status(adv), wall_s=adv.get("wall_s"),
                         advise_command=adv.get("command"), other_cpu_share=r.get(
                             "other_cpu_share"), worth=worth, **fields))  # fmt: skip
    return rows


def quick_vs_default(path: Path, d: dict[str, Any]) -> list[dict[str, Any]]:
    """{argv, machine, rows: model -> quick, default, compare}: a row per effort, with the
    configs kept beside the file where there are (their final check and why), and the
    one-process re-time of both picks against the default."""
    env, date = env_from_line(d["machine"], path)
    command = "python benchmarks/quick_vs_default.py " + " ".join(d["argv"])
    kept = path.with_suffix("")
    rows = []
    for r in d["rows"]:
        comp = r.get("compare") or {}
        worth_of: dict[str, Any] = {}
        if comp.get("retime"):
            roles = {"default": "default", "pick quick": "quick", "pick default": "default_effort"}
            for effort in ("quick", "default"):
                worth_of[effort] = _worth_one_process(comp["retime"], roles, "cpu",
                                                      f"pick {effort}")  # fmt: skip
        for effort in ("quick", "default"):
            run = r.get(effort) or {}
            cfg = kept / f"{r['model']}_{effort}.json"
            fields = _config_fields(run)
            if cfg.exists():
                fields.update({k: v for k, v in row_from_config(json.loads(cfg.read_text())).items()
                               if k != "effort_run"})  # fmt: skip
            rows.append(base(path, dict(env), date, command, r["model"], "train", effort,
                             status=_status(run), wall_s=run.get("wall_s"),
                             eager_s=run.get("eager_s"), worth=worth_of.get(effort), **fields))  # fmt: skip
    return rows


def published(path: Path, d: dict[str, Any]) -> list[dict[str, Any]]:
    m = re.search(r"Machine: (?P<name>[^,]+), (?P<n>\d+) cores; torch (?P<torch>[^;]+); Python "
                  r"(?P<py>[^;]+); device (?P<dev>\w+); (?P<date>[\d-]+ [\d:]+)", d["machine"])  # fmt: skip
    assert m is not None, d["machine"]
    env = env_of(m["name"], m["dev"], None, int(m["n"]), m["torch"], m["py"], path,  # type: ignore[arg-type]
                 logical_cpus=int(m["n"]))  # fmt: skip
    date = m["date"].replace(" ", "T") + ":00+00:00"
    command = "python " + " ".join(d["command"])
    rows = []
    for name, v in d["runs"].items():
        run = v["run"]
        if "skipped" in run:
            status = f"skipped: {run['skipped']}"
        elif "stopped" in run:
            status = f"failed: {run['stopped']}"
        else:
            status = "ok"
        fields = _config_fields(run) if run.get("settings") else {}
        rows.append(base(path, dict(env), date, command, name, "train", "default",
                         d["revision"], status=status, wall_s=run.get("wall_s"), **fields))  # fmt: skip
    return rows


# ======================================================================== the markdown tables


def _md_rows(text: str, first: str) -> list[list[str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first}"))
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[start + 1:]
            if not re.match(r"\|\s*-", ln)]  # fmt: skip


def _medians(default_ms: float, others: dict[str, tuple[str, float]], pick: str,
             method: str) -> dict[str, Any]:  # fmt: skip
    """A re-time the file recorded as medians alone: ratios without an interval."""
    roles = {"default": {"label": "default", "process": "default", "median_ms": default_ms}}
    for role, (lab, ms) in others.items():
        roles[role] = {"label": lab, "process": role, "median_ms": ms}
    vs = {r: [round(default_ms / e["median_ms"], 4), None, None] for r, e in roles.items()
          if r != "default"}  # fmt: skip
    return {"rounds": 6, "roles": roles, "vs_default": vs, "pick_vs": {}, "loses_to": {},
            "method": method, "pick_role": pick, "intervals": "not recorded (medians only)"}  # fmt: skip


SEED_CASES = {"seed: 3->16 conv on a big image": "seed_conv2d_3to16",
              "seed: depthwise ConvTranspose2d 2x2/2": "seed_dwconvT_bn",
              "seed: Conv3d (1,3,3) train": "seed_conv3d_1x3x3",
              "seed: Conv2d 512->1024 (scaled)": "seed_conv2d_512to1024"}  # fmt: skip


def _amd_epyc(path: Path, text: str) -> tuple[dict[str, Any], str]:
    m = re.search(r"Device: (?P<name>[^(]+) \((?P<dev>cpu)\), (?P<n>\d+) threads; torch "
                  r"(?P<torch>[^;]+);.*?fingerprint (?P<fp>\w+)", text)  # fmt: skip
    assert m is not None
    env = env_of(m["name"].strip(), "cpu", None, int(m["n"]), m["torch"], None, path,  # type: ignore[arg-type]
                 fingerprint=m["fp"])  # fmt: skip
    day = re.search(r"Notes \((\d{4}-\d\d-\d\d)", text)
    return env, (day[1] if day else added(path)[1][:10]) + "T00:00:00+00:00"


def advisor_vs_defaults(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    env, date = _amd_epyc(path, text)
    method = ("one fresh process for all settings, interleaved, torch.utils.benchmark "
              "(advisor_vs_defaults); medians only")  # fmt: skip
    rows = []
    for c in _md_rows(text, "case"):
        case, mode, _shape, pick, plain, default, mine, every = c[:8]
        worth = _medians(float(default), {"pick": (pick, float(mine)),
                                          "everything on": ("memory_format=channels_last, "
                                                            "amp=bf16", float(every)),
                                          "plain": ("the untouched model, no advisor.apply",
                                                    float(plain))}, "pick", method)  # fmt: skip
        rows.append(base(path, dict(env), date, "python benchmarks/advisor_vs_defaults.py "
                         "--device cpu", SEED_CASES[case], mode, "default", pick=pick,
                         tuning_s=float(c[11]), worth=worth))  # fmt: skip
    return rows


def model_retime(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    env, date = _amd_epyc(path, text)
    method = ("one fresh process for all settings, interleaved, torch.utils.benchmark "
              "(model_retime); medians only")  # fmt: skip
    rows = []
    for c in _md_rows(text, "model"):
        pick = c[1].split(" (=")[0]
        ms = [float(x.split()[0]) if x != "-" else None for x in c[2:7]]
        others = {"pick": (pick, ms[2]), "everything on": ("memory_format=channels_last, "
                  "amp=bf16", ms[3]), "plain": ("the untouched model, no advisor.apply", ms[0])}  # fmt: skip
        if ms[4] is not None:
            others["pick without its layers"] = ("the pick's global settings", ms[4])
        rows.append(base(path, dict(env), date, "python benchmarks/model_retime.py "
                         "advisor/examples/video_cnn.py advisor/examples/small_cnn.py --device cpu",
                         _model(c[0]), "train", "default", pick=pick, tuning_s=float(c[12]),
                         worth=_medians(ms[1], {k: v for k, v in others.items() if v[1]},
                                        "pick", method)))  # fmt: skip
    return rows


def advise_cuda_h200(path: Path) -> list[dict[str, Any]]:
    """The hand-run H200 table: three advise runs of small_cnn (train), stages from the
    advisor's `Time:` line and the wall time from /usr/bin/time."""
    text = path.read_text()
    env = env_of("NVIDIA H200", "cuda", "9.0", 16, "2.11.0+cu130", "3.12.3", path,
                 device_memory_gb=139.8, driver="580.159.04", cuda="13.0", cudnn="91900",
                 triton="3.6.0")  # fmt: skip
    rows = []
    for c in _md_rows(text, "run"):
        run, code, budget, wall = c[0], c[1], c[2], c[3]
        stages = dict(zip(("start-up and load", "global knobs", "re-time", "per-layer",
                           "compile", "final check"), (float(x) for x in c[4:10])))  # fmt: skip
        commit = code.split()[0]
        pick_cell = c[11]
        found = re.match(r"`?([^`]+)`?(?: ([\d.]+)x \[([\d.]+), ([\d.]+)\])?", pick_cell)
        assert found is not None
        pick = found[1].strip()
        claimed = [float(found[i]) for i in (2, 3, 4)] if found[2] else None
        fc = re.match(r"held: ([\d.]+)x \[([\d.]+), ([\d.]+)\], (\d+) rounds", c[12])
        final = ({"where": "fresh process", "speedup": float(fc[1]), "speedup_ci":
                  [float(fc[2]), float(fc[3])], "rounds": int(fc[4]), "held": True}
                 if fc else None)  # fmt: skip
        row = base(path, dict(env), "2026-11-26T00:00:00+00:00", "python3 -m advisor advise "
                   f"advisor/examples/small_cnn.py --device cuda --mode train --budget {budget} "
                   "--storage memory", "small_cnn", "train", "default", commit,
                   wall_s=float(wall), stage_s=stages, pick=pick, trials=int(c[10]),
                   claimed_speedup=claimed[0] if claimed else None,
                   claimed_ci=claimed[1:] if claimed else None, final_check=final,
                   notes=[f"{run}; budget {budget} s" + (f"; final check: {c[12]}" if not fc
                                                         else "")])  # fmt: skip
        row["dirty"] = "+" in code  # a patch on top of the commit
        if row["dirty"]:
            row["notes"].append(f"code: {code}")
        rows.append(row)
    return rows


READERS = {"advise_walltime": advise_walltime, "effort_levels": effort_levels,
           "gpu_acceptance": gpu_acceptance, "gpu_check": gpu_check, "zoo": zoo,
           "quick_vs_default": quick_vs_default, "published": published}  # fmt: skip
MARKDOWN = {"advisor_vs_defaults_cpu.md": advisor_vs_defaults, "model_retime_cpu.md": model_retime,
            "advise_cuda_h200.md": advise_cuda_h200}  # fmt: skip


def rows_of(path: Path) -> list[dict[str, Any]] | None:
    """The rows of one result file, or None where it is not one the table can hold."""
    if path.name in MARKDOWN:
        return MARKDOWN[path.name](path)
    if path.suffix != ".json" or path.parent != RESULTS:
        return None
    for prefix, reader in READERS.items():
        if path.name.startswith(prefix + "_"):
            return reader(path, json.loads(path.read_text()))
    return None


def main() -> int:
    rows: list[dict[str, Any]] = []
    left = []
    for path in sorted(p for p in RESULTS.rglob("*") if p.is_file()):
        got = rows_of(path)
        if got is None:
            left.append(path)
            continue
        rows += got
        print(f"{path.relative_to(ROOT)}: {len(got)} rows", file=sys.stderr)
    rows.sort(key=lambda r: r["date"])
    if "--dry-run" not in sys.argv:
        append(rows, TABLE)
    print(f"{len(rows)} rows; not imported: {len(left)} files", file=sys.stderr)
    for p in left:
        print(f"  {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
