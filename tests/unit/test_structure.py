"""The tree stays livable: every perf script is documented, and the package has no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "backends" / "bucketserve"


def test_every_perf_script_is_listed_in_perf_readme():
    readme = (ROOT / "perf" / "README.md").read_text()
    scripts = [
        rel.as_posix()
        for rel in sorted(p.relative_to(ROOT / "perf") for p in (ROOT / "perf").rglob("*"))
        if rel.suffix in (".py", ".sh")  # not results, caches or tool venvs (perf/.aiperf-venv)
        and not any(
            part in ("results", "__pycache__") or part.startswith(".") for part in rel.parts
        )
    ]
    assert len(scripts) > 20  # the walk found the suites
    missing = [s for s in scripts if f"`{s}`" not in readme and f"`{Path(s).name}`" not in readme]
    assert not missing, f"perf/README.md does not list: {missing}"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules `path` imports at module level (not inside functions: those are the
    deliberate late imports, which cannot form an import-time cycle)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks import nothing at run time
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles a depth-first walk meets (each as a path that returns to its first module)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_find_cycles_finds_one():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_package_has_no_import_cycle():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    graph = {name: imports(path, name, set(paths)) for name, path in paths.items()}
    assert (
        len(graph) > 100
        and "bucketserve.serving.core.messages" in graph["bucketserve.serving.core.relay"]
    )  # the walk sees the imports
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles[:10])
