"""The package's shape: no import cycle among its modules (imports inside functions count),
no function over 60 lines and no module over 400, no folder of ``strategies/`` over 15
modules, every package
says what it owns, ``strategies/`` holds families (folders), and ARCHITECTURE.md names only
files and modules that exist, and its trees list exactly the package's top level and
``strategies/``.

Read with ``ast`` from the files alone (nothing is imported), wherever the modules live, so
the check holds in any layout of ``kdist_magics/``.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import pytest

#: the code's shape, read from its files: the same in every environment
pytestmark = pytest.mark.anystack

PACKAGE = Path(__file__).resolve().parents[1] / "kdist_magics"
MAX_LINES = 60
MAX_MODULE_LINES = 400
MAX_FOLDER_MODULES = 15


def _modules() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package)}`` for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _target(name: str, modules) -> str | None:
    """The module an import of ``name`` runs: itself, else its nearest enclosing module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path, is_package: bool, modules) -> dict[str, int]:
    """``{module of this package: line}`` that ``name`` imports, anywhere in the file."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # ``from pkg import mod`` imports the module ``pkg.mod``; other names come from pkg
            wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in filter(None, (_target(w, modules) for w in wanted)):
            if target != name and target.split(".")[0] == PACKAGE.name:
                out.setdefault(target, node.lineno)
    return out


def import_graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    return {name: _imports(name, path, pkg, modules) for name, (path, pkg) in modules.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One closed path per strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, set(g), g[0]) for g in groups]


def _closed_path(graph, group: set[str], start: str) -> list[str]:
    """A shortest path ``start -> ... -> start`` inside ``group``."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return paths[v] + [start]
                if w in group and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return sorted(group)


def long_functions(limit: int = MAX_LINES) -> list[str]:
    """``path:line qualified.name (N lines)`` for every function longer than ``limit``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)

        def walk(node, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    lines = child.end_lineno - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and lines > limit:
                        found.append(f"{rel}:{child.lineno} {name} ({lines} lines)")
                    walk(child, name + ".")
                else:
                    walk(child, prefix)

        walk(ast.parse(path.read_text(), str(path)), "")
    return found


def test_the_package_is_found_and_its_imports_are_read():
    graph = import_graph()
    assert "kdist_magics.magics" in graph and "kdist_magics.strategies" in graph
    assert any(target.endswith(".errors") for target in graph["kdist_magics.magics"])


def test_no_import_cycle_among_the_modules_function_local_imports_included():
    graph = import_graph()
    found = [" -> ".join(path) + f"  (line {graph[path[-2]][path[-1]]} of {path[-2]})" for path in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_cycle_check_sees_a_cycle_through_an_import_inside_a_function():
    graph = {"p.a": {"p.b": 3}, "p.b": {"p.c": 9}, "p.c": {"p.a": 40}, "p.d": {"p.a": 1}}
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert cycles({"p.a": {"p.b": 1}, "p.b": {}}) == []


def test_no_function_over_60_lines():
    found = long_functions()
    assert not found, f"functions over {MAX_LINES} lines:\n" + "\n".join(found)


def long_js_functions(path: Path, limit: int = MAX_LINES) -> list[str]:
    """``function`` declarations in a JavaScript file longer than ``limit`` lines, nested ones
    counted in their own right and inside the one that holds them (braces matched; those in
    strings and template literals come in pairs on a line)."""
    lines = path.read_text().splitlines()
    found = []
    for start, line in enumerate(lines):
        m = re.match(r"\s*(?:export\s+)?(?:async\s+)?function\s+(\w+)\s*\(", line)
        if not m:
            continue
        depth, opened = 0, False
        for end in range(start, len(lines)):
            depth += lines[end].count("{") - lines[end].count("}")
            opened = opened or "{" in lines[end]
            if opened and depth <= 0:
                break
        if end - start + 1 > limit:
            found.append(f"{path.name}:{start + 1} {m.group(1)} ({end - start + 1} lines)")
    return found


def test_the_dashboards_javascript_keeps_the_same_function_length_rule():
    found = [f for path in sorted((PACKAGE / "watch" / "static").glob("*.js")) for f in long_js_functions(path)]
    assert not found, f"JavaScript functions over {MAX_LINES} lines:\n" + "\n".join(found)


def test_the_javascript_length_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"  x += {i};" for i in range(70))
    (tmp_path / "a.js").write_text(
        f"function short() {{ return 1; }}\nexport function long(x) {{\n{body}\n  return x;\n}}\n"
    )
    assert long_js_functions(tmp_path / "a.js") == ["a.js:2 long (73 lines)"]


def test_every_package_says_what_it_owns():
    bare = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("__init__.py"))
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not bare, "packages without a docstring: " + ", ".join(bare)


@pytest.fixture
def architecture() -> str:
    """ARCHITECTURE.md's text (the test skips in a tree without it)."""
    page = PACKAGE.parent / "ARCHITECTURE.md"
    if not page.exists():
        pytest.skip("this tree has no ARCHITECTURE.md")
    return page.read_text()


def test_the_architecture_page_names_only_what_exists(architecture):
    text = architecture
    names = {p.name for p in PACKAGE.rglob("*") if "__pycache__" not in p.parts}
    missing = [path for path in re.findall(r"kdist_magics/[\w/.]*\w", text) if not (PACKAGE.parent / path).exists()]
    paths = {"/".join(p.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("*")}
    missing += [
        f"`{name}`"
        for name in re.findall(r"`([\w/]+\.(?:py|js|css))`", text)
        if ("/" not in name and name not in names)
        or (
            "/" in name
            and not (PACKAGE.parent / name).exists()
            and not any(p == name or p.endswith("/" + name) for p in paths)
        )
    ]
    missing += [
        dotted
        for dotted in re.findall(r"kdist_magics(?:\.\w+)+", text)
        if not (PACKAGE.parent / dotted.replace(".", "/")).with_suffix(".py").exists()
        and not (PACKAGE.parent / dotted.replace(".", "/") / "__init__.py").exists()
    ]
    assert not missing, "ARCHITECTURE.md names what is not there: " + ", ".join(missing)


def unnamed_modules(text: str) -> list[str]:
    """The package's modules (packages aside: the trees name them) that ``text`` does not name:
    by their path from the package or from a folder inside it (``engines/run.py``), or in
    backticks by a file name no other module has."""
    modules = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__init__.py"]
    names = collections.Counter(p.name for p in modules)
    out = []
    for path in modules:
        parts = path.relative_to(PACKAGE).parts
        ways = ["/".join(parts[i:]) for i in range(max(1, len(parts) - 1))]
        if not any(w in text for w in ways) and not (names[path.name] == 1 and f"`{path.name}`" in text):
            out.append("/".join(parts))
    return out


def test_the_architecture_page_names_every_module(architecture):
    unnamed = unnamed_modules(architecture)
    assert not unnamed, "modules ARCHITECTURE.md does not name: " + ", ".join(unnamed)


def test_the_naming_check_sees_a_module_left_out(architecture):
    assert unnamed_modules(architecture.replace("_aliases.py", "")) == ["keras_horovod/_aliases.py"]


def _top_level(folder: Path = PACKAGE) -> set[str]:
    """A package's own entries: its modules and subpackages, by name."""
    return {p.name for p in folder.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}


def _tree(architecture: str, root: str) -> set[str]:
    """The entries of the page's tree whose first line is ``root``."""
    for block in architecture.split("```")[1::2]:
        lines = block.splitlines()
        if len(lines) > 1 and lines[1].strip() == root:
            return {line.split()[0].rstrip("/") for line in lines[2:] if line.strip()}
    pytest.fail(f"ARCHITECTURE.md has no tree of {root}")


def test_the_top_level_is_what_the_architecture_page_lists(architecture):
    """A new module at the package's top level is a decision: the page's tree names it."""
    listed, present = _tree(architecture, "kdist_magics/"), _top_level()
    assert present == listed, (
        f"not on the page: {sorted(present - listed)}; on the page, not in the package: {sorted(listed - present)}"
    )


def test_strategies_holds_families_and_the_page_draws_them(architecture):
    """``ls kdist_magics/strategies/`` shows families: folders, beside the registry, what every
    strategy provides and the option table; the page's tree of it is exact."""
    folder = PACKAGE / "strategies"
    present = _top_level(folder)
    assert {p for p in present if p.endswith(".py")} == {"__init__.py", "base.py", "capabilities.py"}
    assert present == _tree(architecture, "strategies/")


#: the families named for a library; what they stand on is shared: kernel/ (a cell in the
#: notebook, and the in-kernel strategies), engines/, processes/ and frameworks/ (each backend's seam)
FAMILIES = ("horovod", "multiworker", "sharded")


def family_crossings(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports (``a -> b``, inside functions too) from one library family into another, or from
    a shared folder of ``strategies/`` into a family."""

    def folder(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "strategies" else None

    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if folder(a) and folder(b) in FAMILIES and folder(a) != folder(b)
    )


def test_the_strategy_families_import_the_shared_layers_not_each_other():
    """``--strategy sharded --np N`` stands on processes/ as multiworker does, and each backend's
    calls are its seam in frameworks/: no family reaches into another, and nothing shared
    reaches into a family."""
    crossings = family_crossings(import_graph())
    assert not crossings, "imports into a strategy family from outside it: " + ", ".join(crossings)


def test_the_family_check_sees_a_crossing():
    graph = {
        "kdist_magics.strategies.sharded.strategy": {
            "kdist_magics.strategies.multiworker.tf_workers": 3,
            "kdist_magics.strategies.kernel.run": 4,
        },
        "kdist_magics.strategies.processes.jax_processes": {"kdist_magics.strategies.sharded.layout": 9},
        "kdist_magics.strategies.sharded.layout": {"kdist_magics.strategies.processes.group": 1},
        "kdist_magics.strategies": {"kdist_magics.strategies.sharded.strategy": 1},
    }
    assert family_crossings(graph) == [
        "kdist_magics.strategies.processes.jax_processes -> kdist_magics.strategies.sharded.layout",
        "kdist_magics.strategies.sharded.strategy -> kdist_magics.strategies.multiworker.tf_workers",
    ]


def test_the_magic_is_a_thin_front():
    """magics.py parses, chooses and hands the cell on: its settings are settings.py's, its
    subcommands commands/', the run cell.py's; it stays under 250 lines."""
    lines = len((PACKAGE / "magics.py").read_text().splitlines())
    assert lines < 250, f"magics.py has {lines} lines"


def test_no_module_over_400_lines_and_no_strategies_folder_over_15_modules():
    long = [
        f"{p.relative_to(PACKAGE.parent)}: {n}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines: " + ", ".join(long)
    strategies = PACKAGE / "strategies"  # (cluster/ holds 16, its launchers among them)
    crowded = [
        f"{d.relative_to(PACKAGE.parent)}: {n}"
        for d in [strategies, *strategies.rglob("*")]
        if d.is_dir() and (n := len(list(d.glob("*.py")))) > MAX_FOLDER_MODULES
    ]
    assert not crowded, f"folders over {MAX_FOLDER_MODULES} modules: " + ", ".join(crowded)


@pytest.mark.parametrize("check", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_finds_nothing(check):
    """Ruff's lint as pyproject.toml configures it (pyflakes' errors, pycodestyle's errors and
    blank-line rules) and its formatter (the tree as ``ruff format`` writes it) over the whole
    tree (the notebooks left out: their cells use names %%kdist --pull binds; the code kdist runs
    as its authors wrote it, left out of formatting)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed here (it is in the test extra: make test-fast installs it)")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([ruff, *check, "--no-cache", "."], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_no_work_item_numbers_in_code_or_comments():
    """A work-item number means nothing to a reader of the code: what a comment or docstring says
    stands on its own (an upstream project's issue is named with its project, owner/repo#N)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for folder in ("kdist_magics", "tests", "benchmarks", "scripts"):
        for path in (root / folder).rglob("*"):
            if path.suffix not in (".py", ".js") or "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\b[Ii]ssues? \d+(\.\d+)?\b", line):
                    found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


#: where ARCHITECTURE.md's generated list of imports across components begins and ends
IMPORTS_BEGIN = "<!-- imports across components: begin (python tests/test_structure.py writes it) -->"
IMPORTS_END = "<!-- imports across components: end -->"
#: what every component may import without being listed (the page says so)
SHARED = ("messages", "errors", "spec")


def _component(module: str) -> str:
    """``cluster/``, ``strategies/``, ... for a folder's modules; ``magics.py`` for a top-level one."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    folder = PACKAGE / parts[0]
    return f"{parts[0]}/" if folder.is_dir() else f"{parts[0]}.py"


def _path(module: str) -> str:
    path, is_package = _modules()[module]
    return "/".join(path.relative_to(PACKAGE).parts)


def imports_across_components() -> str:
    """The table ARCHITECTURE.md holds: for each pair of components, which module imports which
    (imports inside functions too; the shared top-level modules left out)."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for module, targets in import_graph().items():
        for target in targets:
            source, dest = _component(module), _component(target)
            if source == dest or dest.rstrip("/").removesuffix(".py") in SHARED:
                continue
            pairs.setdefault((source, dest), []).append(f"{_path(module)} → {_path(target)}")
    rows = ["| from | to | which module imports which |", "| --- | --- | --- |"]
    rows += [f"| `{a}` | `{b}` | " + ", ".join(sorted(edges)) + " |" for (a, b), edges in sorted(pairs.items())]
    return "\n".join([IMPORTS_BEGIN, *rows, IMPORTS_END])


def test_the_architecture_page_lists_every_import_across_components(architecture):
    """The page's table is the code's own imports, as they are: regenerate it with
    ``python tests/test_structure.py`` when a component starts (or stops) leaning on another."""
    start, end = architecture.find(IMPORTS_BEGIN), architecture.find(IMPORTS_END)
    assert start >= 0 and end > start, "ARCHITECTURE.md has no generated import table"
    listed = architecture[start : end + len(IMPORTS_END)]
    assert listed == imports_across_components(), (
        "ARCHITECTURE.md's imports across components differ from the code's: run python tests/test_structure.py"
    )


def test_the_import_table_sees_an_import_inside_a_function():
    table = imports_across_components()
    # cell.py imports strategies' RunContext inside execute(); magics.py imports commands/ in one
    assert "cell.py → strategies/__init__.py" in table and "magics.py → commands/__init__.py" in table


if __name__ == "__main__":  # rewrite ARCHITECTURE.md's generated import table
    page = PACKAGE.parent / "ARCHITECTURE.md"
    text = page.read_text()
    start, end = text.find(IMPORTS_BEGIN), text.find(IMPORTS_END)
    if start < 0 or end < start:
        raise SystemExit(f"{page} has no {IMPORTS_BEGIN!r} ... {IMPORTS_END!r} block")
    page.write_text(text[:start] + imports_across_components() + text[end + len(IMPORTS_END) :])
    print(f"wrote {page}'s table of imports across components")


def strategy_writers(path: Path) -> list[str]:
    """Module-level functions in ``path`` that write an attribute of a parameter named
    ``strategy`` (``strategy.x = ...``, ``strategy.x |= ...``): per-run state kept on the
    strategy from outside it."""
    found = []
    for fn in ast.parse(path.read_text()).body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        if "strategy" not in params:
            continue
        for node in ast.walk(fn):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            for t in targets:
                for sub in ast.walk(t):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "strategy"
                    ):
                        found.append(f"{path.name}:{node.lineno} {fn.name} writes strategy.{sub.attr}")
    return found


def test_no_function_of_the_engine_path_writes_a_strategys_state():
    """A cell on engines is one EngineRun: its steps are given the run, and what lasts between
    cells is written by the strategy's own methods, never by a module function handed it."""
    engines = PACKAGE / "strategies" / "engines"
    found = [w for path in sorted(engines.glob("*.py")) for w in strategy_writers(path)]
    assert not found, "\n".join(found)


def test_the_writer_check_sees_a_function_writing_a_strategys_state(tmp_path):
    path = tmp_path / "step.py"
    path.write_text(
        "def step(strategy, ok):\n    if ok:\n        strategy.lost |= {1}\n"
        "    strategy.needs_restart = 'x'\n\ndef fine(strategy):\n    return strategy.cluster\n"
    )
    assert sorted(w.split(" ", 1)[1] for w in strategy_writers(path)) == [
        "step writes strategy.lost",
        "step writes strategy.needs_restart",
    ]
