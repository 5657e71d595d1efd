"""The package's layout holds: folders by stage in the order docs/architecture.md writes down, no
import circle (imports inside functions and under TYPE_CHECKING count), no module over 400 lines,
no folder re-exporting its modules' names, and CUDA, cuDNN and oneDNN named only in the device
seam.

The imports are read from the source with `ast`, so nothing of the package runs here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "advisor"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_LINES = 400
MAX_TOP_LEVEL = 16
DEVICE_NAMES = re.compile(r"torch\.(cuda|backends\.(cudnn|mkldnn|cuda))\b")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The package's modules `name` imports anywhere in its source."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # `from advisor import impls` names a module; `from advisor.knobs import X` a name.
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                       for a in node.names]  # fmt: skip
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _layers() -> list[list[str]]:
    """The folder order of docs/architecture.md: its fenced `layers` block, bottom first."""
    text = ARCHITECTURE.read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    layers = []
    for line in block.group(1).splitlines():
        number, _, names = line.strip().partition(" ")
        if number.isdigit():
            layers.append([n.strip() for n in names.split(",") if n.strip()])
    return layers


def _layer_of(name: str, layers: list[list[str]]) -> int | None:
    rel = name.removeprefix("advisor").removeprefix(".")
    for i, group in enumerate(layers):
        for entry in group:
            if entry.endswith("/"):
                if rel == entry[:-1] or rel.startswith(entry[:-1] + "."):
                    return i
            elif rel == (entry if entry != "__init__" else ""):
                return i
    return None


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_ones() -> None:
    layers = _layers()
    unplaced = [n for n in MODULES if _layer_of(n, layers) is None]
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"
    upward = [
        f"{a} (layer {_layer_of(a, layers)}) imports {b} (layer {_layer_of(b, layers)})"
        for a, targets in GRAPH.items()
        for b in targets
        if (_layer_of(b, layers) or 0) > (_layer_of(a, layers) or 0)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circle() -> None:
    # Tarjan's strongly connected components: any with two modules or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_no_module_over_400_lines_and_few_at_the_top() -> None:
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not long, long
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_cuda_cudnn_and_onednn_are_named_only_in_the_device_seam() -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for name, path in MODULES.items()
        if not name.startswith("advisor.device")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if DEVICE_NAMES.search(line)
    ]
    assert not outside, "\n".join(outside)


@pytest.mark.parametrize("folder", sorted(p.name for p in PACKAGE.iterdir() if p.is_dir()
                                          and (p / "__init__.py").exists()))  # fmt: skip
def test_each_folder_says_what_it_offers_and_re_exports_nothing(folder: str) -> None:
    tree = ast.parse((PACKAGE / folder / "__init__.py").read_text())
    doc = ast.get_docstring(tree)
    assert doc, f"advisor/{folder}/__init__.py has no docstring"
    # A name has one path: what the folder's __init__ imports of the package, it uses itself.
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("advisor") for a in n.names}  # fmt: skip
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert imported <= used, f"advisor/{folder}/__init__.py re-exports {imported - used}"
    if folder != "examples":
        modules = {p.stem for p in (PACKAGE / folder).glob("*.py")} - {"__init__"}
        public = {m for m in modules if not m.startswith("_")}
        named = {m for m in public if re.search(rf"`{m}`|\b{m}\b", doc)}
        assert named == public, f"advisor/{folder}: its docstring does not name {public - named}"


def _tree_block() -> str:
    text = ARCHITECTURE.read_text()
    return text.split("## The tree", 1)[1].split("## The folder order", 1)[0]


def test_the_architecture_page_names_every_module_and_each_mechanism_names_real_ones() -> None:
    """Every module of the package is in the page's tree (by its name, under its folder), and
    every module a mechanism row names exists, so the page cannot drift from the code."""
    parts_of_tree = re.split(r"\n  (?=[a-z_]+/ )", _tree_block())
    top, by_folder = parts_of_tree[0], {p.split("/", 1)[0]: p for p in parts_of_tree[1:]}
    missing = []
    for name, path in MODULES.items():
        parts = name.split(".")
        if path.name == "__init__.py" and len(parts) > 1 or parts[1:2] == ["examples"]:
            continue  # a folder's own docstring says what it offers (checked below)
        where = top if len(parts) <= 2 else by_folder.get(parts[1], "")
        short = parts[-1] if len(parts) > 1 else "__init__"
        if not re.search(rf"(?<![\w.]){re.escape(short)}(?!\w)", where):
            missing.append(name)
    assert not missing, f"modules docs/architecture.md's tree does not name: {missing}"
    table = ARCHITECTURE.read_text().split("## The mechanisms", 1)[1].split("## One `advise`", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) >= 20
    known = {n.removeprefix("advisor.").replace(".", "/"): path for n, path in MODULES.items()}
    wrong = []
    for row in rows:
        for module, name in re.findall(r"`([a-z_/]+)`(?: \(`(\w+)`\))?", row.split("|")[2]):
            if module not in known:
                wrong.append(module)
            elif name and not re.search(rf"\b(def|class) {name}\b", known[module].read_text()):
                wrong.append(f"{module}.{name}")
    assert not wrong, f"mechanism rows name what the code does not have: {wrong}"
