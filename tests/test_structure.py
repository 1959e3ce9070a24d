"""The package's shape: dependencies point one way (no import circle, lazy imports included)
and modules stay small enough to read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tuner"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every tuner module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("tuner"):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tuner"))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for target in _imports(path):
            # "from tuner.launch import X" may name a submodule or a package attribute
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_the_package() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


LAYERS: tuple[tuple[str, ...], ...] = (
    ("tuner.errors", "tuner.outcome", "tuner.layout", "tuner._loader"),
    ("tuner.catalog",),
    ("tuner.spec",),
    ("tuner.config",),
    ("tuner.models",),
    ("tuner.space",),
    ("tuner.calibrate",),
    ("tuner.search",),
    ("tuner.launch",),
    ("tuner.logs",),
    ("tuner.profile",),
    ("tuner.study",),
    ("tuner.report",),
    ("tuner.api",),
    ("tuner",),
    ("tuner.cli",),
)
"""The package's layers, bottom first (docs/architecture.md says what each owns): a module may
import its own layer and the layers below it, never one above."""


def _layer(module: str) -> int:
    """The index in :data:`LAYERS` of the layer ``module`` belongs to (its longest prefix)."""
    best, rank = -1, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    if rank < 0:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")
    return rank


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``A imports B`` for every import of a module from a layer above its own."""
    return [
        f"{name} imports {dep} ({LAYERS[_layer(name)][0]} is below {LAYERS[_layer(dep)][0]})"
        for name, deps in sorted(graph.items())
        for dep in sorted(deps)
        if _layer(dep) > _layer(name)
    ]


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    violations = _layer_violations(_graph())
    assert not violations, "\n".join(violations)


def test_the_layer_check_names_a_wrong_import_and_a_circle() -> None:
    """The checks above fail, naming the import, when a model imports the loop or a circle
    forms."""
    graph = _graph()
    assert not _layer_violations(graph)
    graph["tuner.models.memory.estimate"] = graph["tuner.models.memory.estimate"] | {
        "tuner.study.loop"
    }
    assert _layer_violations(graph) == [
        "tuner.models.memory.estimate imports tuner.study.loop (tuner.models is below tuner.study)"
    ]
    graph = _graph()
    graph["tuner.spec.frameworks"] = graph["tuner.spec.frameworks"] | {"tuner.spec.study"}
    cycle = _cycle(graph)
    assert cycle is not None and "tuner.spec.frameworks" in cycle and "tuner.spec.study" in cycle


def test_every_module_belongs_to_a_layer_and_every_layer_exists() -> None:
    graph = _graph()
    for name in graph:
        _layer(name)
    for layer in LAYERS:
        for prefix in layer:
            assert prefix in graph, f"LAYERS names {prefix}, which is not a module"


def test_the_models_config_and_spec_never_import_launch_study_report_or_cli() -> None:
    graph = _graph()
    lower = ("tuner.spec", "tuner.config", "tuner.models")
    upper = ("tuner.launch", "tuner.study", "tuner.report", "tuner.cli")
    for name, deps in graph.items():
        if name.startswith(lower):
            wrong = sorted(d for d in deps if d.startswith(upper))
            assert not wrong, f"{name} imports {wrong}"


def test_every_subpackage_says_what_it_owns_and_may_import() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent == PACKAGE or init.parent.name == "studies":
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(PACKAGE.parent)} has no docstring"


def test_the_top_level_stays_small() -> None:
    entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 22, sorted(entries)


def test_the_study_loop_reads_in_one_sitting() -> None:
    assert len((PACKAGE / "study" / "loop.py").read_text().splitlines()) < 500


MAX_MODULE_LINES = 500
"""No module of the package is longer (one sitting), so a module that grows past it is split
along a seam rather than left to become the 2,800-line kind."""
OVERSIZED: dict[str, str] = {}
"""Modules allowed over :data:`MAX_MODULE_LINES` for now, each with the reason (none)."""
MAX_FUNCTION_LINES = 100
"""No function is longer (the aim is under 50)."""


def test_every_module_stays_under_the_size_limit() -> None:
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
    }
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES and name not in OVERSIZED}
    assert not over, f"over {MAX_MODULE_LINES} lines (split them along a seam): {over}"
    assert set(OVERSIZED) <= set(sizes), "an exception names a module that is gone"
    needless = [name for name in OVERSIZED if sizes[name] <= MAX_MODULE_LINES]
    assert not needless, f"exceptions no longer needed: {needless}"


def test_every_function_stays_under_the_size_limit() -> None:
    over = sorted(
        f"{p.relative_to(PACKAGE)}:{node.lineno} {node.name} ({n} lines)"
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    )
    assert not over, f"over {MAX_FUNCTION_LINES} lines: {over}"


WORKLOADS = PACKAGE.parent / "workloads"
"""The training scripts tuner ships next to the package (run by torchrun, not installed)."""


def test_every_workload_module_stays_under_the_size_limit() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in WORKLOADS.glob("*.py")}
    assert "gpt_deepspeed.py" in sizes
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"over {MAX_MODULE_LINES} lines (split them along a seam): {over}"


def test_no_workload_module_imports_the_entry_script() -> None:
    """gpt_deepspeed.py runs as ``__main__``; a sibling importing it would run it a second time
    as another module, with a second WorkloadConfigError class that ``main`` does not catch."""
    importers = sorted(
        p.name
        for p in WORKLOADS.glob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if (isinstance(node, ast.ImportFrom) and node.module == "gpt_deepspeed")
        or (isinstance(node, ast.Import) and any(a.name == "gpt_deepspeed" for a in node.names))
    )
    assert importers == []


def test_one_place_spells_the_recompute_setting() -> None:
    """``full:uniform:1`` (and ``selective:core_attn+moe_act``) is built by
    tuner.spec.recompute.recompute_text only: ParallelConfig.recompute_setting and the study loader
    both call it (the loader sits below tuner.config.parallel, so the spelling moved down to
    it)."""
    spellers = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
        if 'f"full:' in p.read_text() or 'f"full/' in p.read_text()
    )  # fmt: skip
    assert spellers == ["spec/recompute.py"]
