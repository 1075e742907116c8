"""The structure of the orthoserve package (client/python/src/orthoserve), read from its source with `ast` (nothing is
imported): no import cycle among its modules, no module over MAX_LINES lines, and no module that uses another
module's private names (a leading underscore: private to the module that defines it).

The import graph has an edge for every import statement of an orthoserve module, wherever it stands (at the top, in
a function, or under `if TYPE_CHECKING:`: a type-only import is still a dependency, and a cycle through one is still a
cycle), to the orthoserve module it names; importing a submodule also runs its packages' __init__, which adds no edge
here. The generated stubs (orthoserve._proto) are left out: they import only protobuf and grpc."""

import ast
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from conftest import REPO

SOURCE = REPO / "client" / "python" / "src"
PACKAGE = SOURCE / "orthoserve"
MAX_LINES = 800  # docs' file-size guide: split a module before it gets here.
GENERATED = "_proto"


def modules(root: pathlib.Path = PACKAGE) -> Dict[str, pathlib.Path]:
    """The package's modules by dotted name ("orthoserve.torch" for orthoserve/torch/__init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if GENERATED in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(name: str, known: Dict[str, pathlib.Path]) -> bool:
    return known[name].name == "__init__.py"


def _known_prefix(dotted: str, known: Dict[str, pathlib.Path]) -> str:
    """The longest prefix of `dotted` that is a module of the package ("" when none is)."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return ""


def _from_base(name: str, node: ast.ImportFrom, known: Dict[str, pathlib.Path]) -> str:
    """The module an ImportFrom in module `name` imports from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if _is_package(name, known) else name.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports(name: str, known: Dict[str, pathlib.Path]) -> Iterator[Tuple[str, int, str]]:
    """(imported module, line, imported name or "") for each orthoserve module that module `name` imports (not the
    generated stubs)."""
    tree = ast.parse(known[name].read_text(), str(known[name]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known_prefix(alias.name, known)
                if target and GENERATED not in alias.name.split("."):
                    yield target, node.lineno, ""
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(name, node, known)
            if GENERATED in base.split("."):
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    yield submodule, node.lineno, ""
                elif _known_prefix(base, known):
                    yield _known_prefix(base, known), node.lineno, alias.name


def import_graph(known: Dict[str, pathlib.Path]) -> Dict[str, Dict[str, int]]:
    """module -> {imported module: line of the first such import}."""
    graph: Dict[str, Dict[str, int]] = {m: {} for m in known}
    for m in known:
        for target, line, _ in imports(m, known):
            graph[m].setdefault(target, line)
    return graph


def cycles(graph: Dict[str, Dict[str, int]]) -> List[Tuple[List[str], List[str]]]:
    """(the modules, one cycle through them: a path that ends where it starts) of each strongly connected component
    that has a cycle (Tarjan's algorithm, then the shortest cycle through its first module)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [(c, _cycle_through(c[0], set(c), graph)) for c in components if len(c) > 1 or c[0] in graph[c[0]]]


def _cycle_through(start: str, members: Set[str], graph: Dict[str, Dict[str, int]]) -> List[str]:
    """The shortest path from `start` back to itself inside `members` (breadth first)."""
    parents: Dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return list(reversed(path)) + [start]
                if w in members and w not in parents:
                    parents[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # A component of several modules always has one.


def describe(component: List[str], cycle: List[str], graph: Dict[str, Dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in zip(cycle, cycle[1:])]
    return f"import cycle among {', '.join(component)}; for one: " + " ; ".join(steps)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names(path: pathlib.Path) -> Set[str]:
    """The private names a module defines: its module-level functions, classes and assignments, the methods and
    class attributes of its classes, the attributes it assigns (x._a = ...) and its classes' __slots__."""
    tree = ast.parse(path.read_text(), str(path))
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                  for t in node.targets):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and
                         isinstance(c.value, str))
    return {n for n in names if _private(n)}


def private_reaches(known: Dict[str, pathlib.Path]) -> List[str]:
    """Uses of another orthoserve module's private names: `from orthoserve.m import _name`, and `x._name` where
    `_name` is a private name that another module of the package defines and this one does not."""
    defined = {m: private_names(p) for m, p in known.items()}
    problems = []
    for m, path in known.items():
        others = set().union(*(names for other, names in defined.items() if other != m))
        for target, line, imported in imports(m, known):
            if _private(imported):
                problems.append(f"{m} line {line} imports {imported} from {target}")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and node.attr in others and
                    node.attr not in defined[m]):
                owners = sorted(o for o, names in defined.items() if node.attr in names and o != m)
                problems.append(f"{m} line {node.lineno} uses {ast.unparse(node)} ({node.attr} is private to "
                                f"{', '.join(owners)})")
    return problems


def test_the_package_has_no_import_cycle():
    known = modules()
    assert {"orthoserve", "orthoserve.client", "orthoserve.shm"} <= set(known), sorted(known)
    graph = import_graph(known)
    assert "orthoserve.errors" in graph["orthoserve.client"]  # The graph sees the package's imports.
    found = cycles(graph)
    assert not found, "\n".join(describe(c, cycle, graph) for c, cycle in found)


def test_the_region_code_imports_nothing_of_the_client():
    graph = import_graph(modules())
    for region_module in ("orthoserve.shm", "orthoserve.cuda_ipc"):
        assert "orthoserve.client" not in graph[region_module], region_module


@pytest.mark.parametrize("limit", [MAX_LINES])
def test_no_module_of_the_package_is_over_the_size_guide(limit):
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    over = {m: n for m, n in sizes.items() if n > limit}
    assert not over, f"modules over {limit} lines (split them by responsibility): {over}"


def test_no_module_uses_another_modules_private_names():
    problems = private_reaches(modules())
    assert not problems, "\n".join(problems)


def test_the_checks_see_a_cycle_and_a_private_reach(tmp_path):
    """The checks themselves, on a small package written here: a cycle through a TYPE_CHECKING import and a
    relative import is found and printed, and so is a use of another module's private function and attribute."""
    root = tmp_path / "orthoserve"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("from orthoserve import a\n")
    (root / "a.py").write_text("from orthoserve.sub import b\n\ndef _helper():\n    pass\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n"
                                       "class B:\n    def __init__(self):\n        self._state = 1\n")
    (root / "c.py").write_text("from orthoserve.a import _helper\nfrom orthoserve.sub.b import B\n"
                               "x = B()._state\n")
    known = modules(root)
    assert set(known) == {"orthoserve", "orthoserve.a", "orthoserve.sub", "orthoserve.sub.b", "orthoserve.c"}
    graph = import_graph(known)
    [(component, cycle)] = cycles(graph)
    assert component == ["orthoserve.a", "orthoserve.sub.b"]
    assert cycle in (["orthoserve.a", "orthoserve.sub.b", "orthoserve.a"],
                     ["orthoserve.sub.b", "orthoserve.a", "orthoserve.sub.b"]), cycle
    assert "orthoserve.a (line 1) -> orthoserve.sub.b" in describe(component, cycle, graph)
    problems = private_reaches(known)
    assert problems == ["orthoserve.c line 1 imports _helper from orthoserve.a",
                        "orthoserve.c line 3 uses B()._state (_state is private to orthoserve.sub.b)"], problems
