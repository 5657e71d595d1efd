"""Tables of the profiles a run left in `$ADVISOR_PROFILE_DIR` (advisor/execute/profiling.py).

    python benchmarks/profile_summary.py DIR [--top N] [--out FILE]

Reads every `<role>-<pid>.prof` in DIR (and the `.json` beside it: the process's age when its
profile began, the seconds covered, how it ended) and prints markdown: one table of all
processes, then per process the top N functions by cumulative time, by own time, and own time
by library (torch, the advisor, optuna, Python's own, C builtins, ...). cProfile's overhead
slows Python-heavy code, so read shares, not benchmark figures. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import pstats
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
Key = tuple[str, int, str]  # pstats' function key: file, line, name


@dataclass
class Profile:
    """One process's profile: its role, pid, sidecar and pstats' table."""

    path: Path
    role: str
    pid: int
    meta: dict[str, Any] = field(default_factory=dict)
    stats: dict[Key, tuple[Any, ...]] = field(default_factory=dict)
    total_s: float = 0.0  # own time summed: the seconds the profile saw

    @property
    def covered_s(self) -> float:
        return float(self.meta.get("covered_s") or self.total_s)


def load(folder: Path) -> list[Profile]:
    """Every profile in `folder`, the advisor command's first, then by role and pid."""
    found = []
    for path in sorted(folder.glob("*.prof")):
        role, _, pid = path.stem.rpartition("-")
        side = path.with_suffix(".json")
        meta = json.loads(side.read_text()) if side.exists() else {}
        st = pstats.Stats(str(path))
        table: dict[Key, tuple[Any, ...]] = st.stats  # type: ignore[attr-defined]
        found.append(Profile(path, meta.get("role", role or path.stem),
                             int(meta.get("pid", pid if pid.isdigit() else 0)), meta, table,
                             float(st.total_tt)))  # type: ignore[attr-defined]  # fmt: skip
    return sorted(found, key=lambda p: (p.role != "advisor", p.role, p.pid))


def where(key: Key) -> str:
    """A function as a short, readable name: `torch/__init__.py:12(<module>)`, or a builtin's."""
    file, line, name = key
    if file == "~":  # a C function: pstats names it in full
        return name
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    else:
        if file.startswith(str(ROOT) + "/"):
            file = file[len(str(ROOT)) + 1 :]
        elif "/lib/python" in file:  # the standard library
            file = file.split("/lib/python", 1)[1].partition("/")[2]
    return f"{file}:{line}({name})"


# C functions by what they do: a parent's waits on its children, an import's loading, torch's ops
WAITS = ("poll", "select", "sleep", "waitpid", "posix.read", "acquire", "recv", "_wait")
IMPORTS = ("_imp.", "marshal.loads", "posix.stat", "posix.lstat", "posix.listdir", "io.open_code")


def library(key: Key) -> str:
    """What a function belongs to: a package (its top folder), the advisor, the standard
    library, Python's import system, or a C function by what it does (waiting, loading an
    import, a torch op)."""
    file, _, name = key
    if file == "~":
        if any(w in name for w in WAITS):
            return "waiting (poll, sleep, locks, pipes: C)"
        if any(w in name for w in IMPORTS):
            return "Python (imports)"
        return "torch (C: ops, autograd)" if "torch" in name else "C builtins (other)"
    if file.startswith("<frozen"):
        return "Python (imports)"
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            return file.split(marker, 1)[1].split("/", 1)[0].removesuffix(".py")
    if file.startswith(str(ROOT / "advisor")):
        return "advisor"
    if file.startswith(str(ROOT)):
        return file[len(str(ROOT)) + 1 :].split("/", 1)[0]
    if "/lib/python" in file:
        return "Python (standard library)"
    return "other"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _s(value: float) -> str:
    return f"{value:.3f}"


def processes_table(profiles: list[Profile]) -> list[str]:
    """One row per process; the age at start is what its profile could not see (the
    interpreter's start; for a spawned child, torch's import too)."""
    lines = ["| process | pid | started after (s) | covered (s) | profiled (s) | ended |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for p in profiles:
        age = p.meta.get("age_at_start_s")
        lines.append(f"| {p.role} | {p.pid} | {'?' if age is None else f'{age:.2f}'} | "
                     f"{_s(p.covered_s)} | {_s(p.total_s)} | {p.meta.get('ended', '?')} |")  # fmt: skip
    total = sum(p.covered_s for p in profiles)
    lines.append(f"| all ({len(profiles)} processes) | | | {_s(total)} | "
                 f"{_s(sum(p.total_s for p in profiles))} | |")  # fmt: skip
    return lines


def top_table(p: Profile, top: int, by: str) -> list[str]:
    """The `top` functions by cumulative ("cum") or own ("own") time."""
    col = 3 if by == "cum" else 2
    rows = sorted(p.stats.items(), key=lambda kv: kv[1][col], reverse=True)[:top]
    base = p.total_s or 1.0
    first = "cumulative (s)" if by == "cum" else "own (s)"
    other = "own (s)" if by == "cum" else "cumulative (s)"
    lines = [
        f"| {first} | share | {other} | calls | function |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for key, (cc, nc, tt, ct, _) in rows:
        main, rest = (ct, tt) if by == "cum" else (tt, ct)
        calls = f"{nc}" if nc == cc else f"{nc}/{cc}"
        lines.append(f"| {_s(main)} | {main / base:.0%} | {_s(rest)} | {calls} | "
                     f"`{_cell(where(key))}` |")  # fmt: skip
    return lines


def library_table(p: Profile, top: int) -> list[str]:
    """Own time summed by library (`library`): where the process's seconds were spent."""
    own: dict[str, float] = {}
    for key, (_, _, tt, _, _) in p.stats.items():
        own[library(key)] = own.get(library(key), 0.0) + tt
    base = p.total_s or 1.0
    lines = ["| library | own (s) | share |", "| --- | ---: | ---: |"]
    for name, s in sorted(own.items(), key=lambda kv: kv[1], reverse=True)[:top]:
        lines.append(f"| {_cell(name)} | {_s(s)} | {s / base:.0%} |")
    return lines


def summary(folder: Path, top: int = 15) -> str:
    """The markdown for every profile in `folder`."""
    profiles = load(folder)
    if not profiles:
        return f"No profiles (*.prof) in {folder}.\n"
    out = [f"Profiles in `{folder.name}`: {len(profiles)} processes. cProfile sees each "
           "process (the thread that started it, on Python 3.11) from its profile's start "
           "('started after': the process's age then, which it could not see); its overhead "
           "slows Python-heavy code, so read shares, not benchmark figures.", "",
           *processes_table(profiles)]  # fmt: skip
    for p in profiles:
        out += ["", f"### {p.role} (pid {p.pid}): {p.covered_s:.2f} s covered", ""]
        out += [f"Top {top} by cumulative time:", "", *top_table(p, top, "cum"), ""]
        out += [f"Top {top} by own time:", "", *top_table(p, top, "own"), ""]
        out += ["Own time by library:", "", *library_table(p, top)]
    return "\n".join(out) + "\n"


def write_runs(folders: list[Path], md: Path, tgz: Path, top: int = 15) -> None:
    """Several runs' profile folders (benchmarks/gpu_acceptance.py --profile): their tables
    in one markdown file, a section each, and their files in one .tgz. Not a file per process:
    the device tool brings back 8 files at most."""
    folders = [f for f in folders if f.is_dir()]  # a run stopped before any process wrote
    text = ["# Profiles of the advise runs", ""]
    for folder in folders:
        text += [f"## {folder.name}", "", summary(folder, top)]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(text))
    with tarfile.open(tgz, "w:gz") as tar:
        for folder in folders:
            tar.add(folder, arcname=folder.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the $ADVISOR_PROFILE_DIR a run wrote to")
    ap.add_argument("--top", type=int, default=15, help="functions per table (default 15)")
    ap.add_argument("--out", type=Path, help="write the markdown here too")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"profile_summary: {args.folder} is not a folder", file=sys.stderr)
        return 2
    text = summary(args.folder, args.top)
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
