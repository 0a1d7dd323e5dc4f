"""The package graph is a DAG from the command line down to the shared vocabulary, and the
gateway can never reach torch.

    pdserve                            the command line and the local supervisor
    pdserve.planner                    capacity planning: profiles, simulation, xPyD recommendation
    pdserve.bench                      benchmarks: load client, systems, reports
    pdserve.gateway.colocated          `pdserve serve`: the public front over one in-process engine
    pdserve.gateway  .prefill_svc  .decode_svc   the services; none imports another
    pdserve.cluster                    what every process of a deployment shares
    pdserve.kvtransfer
    pdserve.checkpoints.tiny           the tiny random model's writer (heavy; run as a child process)
    pdserve.checkpoints                what --model names, resolved to a local HF folder (.gguf, hub cache, default, tiny)
    pdserve.engine
    pdserve.kernels
    pdserve.protocol                   the request's vocabulary: errors, sampling parameters, outputs, text
    pdserve.v1                         generated wire code, below them all; imports nothing of ours

Everything installs under the one name `pdserve`; each subpackage keeps its folder at the top of
the repository. A module imports only from floors below its own (any import statement counts,
lazy and type-checking ones too), so no two packages import each other, and the replicas never
need the gateway.

A node is heavy when one of its modules imports torch, triton or cupy (lazily or not). The
disaggregated gateway (`pdserve.gateway`: its fronts and its request driver) reaches only
nodes that are not heavy, so no change inside a package it may import can make it load torch
without this test naming the import; the colocated server is a node of its own above it.
tests/architecture/test_gateway_imports.py checks the same at run time, third-party imports included.
"""
import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS = (
    ("pdserve",),
    ("pdserve.planner",),
    ("pdserve.bench",),
    ("pdserve.gateway.colocated",),
    ("pdserve.gateway", "pdserve.prefill_svc", "pdserve.decode_svc"),
    ("pdserve.cluster",),
    ("pdserve.kvtransfer",),
    ("pdserve.checkpoints.tiny",),
    ("pdserve.checkpoints",),
    ("pdserve.engine",),
    ("pdserve.kernels",),
    ("pdserve.protocol",),
    ("pdserve.v1",),
)
WIRE = "pdserve.v1"
HEAVY_MODULES = ("torch", "triton", "cupy")
FLOOR_OF = {package: level for level, packages in enumerate(FLOORS) for package in packages}
REPLICAS = ("pdserve.prefill_svc", "pdserve.decode_svc")
FOLDER_OF = {package: ROOT.joinpath(*package.split(".")[1:]) for package in FLOOR_OF}
FOLDER_OF.update({"pdserve": ROOT / "pdserve", WIRE: ROOT / "protos" / "pdserve" / "v1"})


def node_of(module: str) -> str | None:
    """The node of the package graph `module` belongs to (its longest node prefix); None for
    modules not ours."""
    parts = module.split(".")
    if parts[0] != "pdserve":
        return None
    return next((".".join(parts[:n]) for n in range(len(parts), 1, -1) if ".".join(parts[:n]) in FLOOR_OF),
                "pdserve")


def module_name(path: Path) -> str:
    """The installed name of the module at `path` (outside the package, its path from the root)."""
    package, folder = max(((package, folder) for package, folder in FOLDER_OF.items()
                           if path.is_relative_to(folder)), key=lambda item: len(item[1].parts),
                          default=(None, ROOT))
    parts = (*([package] if package else []), *path.relative_to(folder).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> Iterator[str]:
    """Every module `path` imports, relative imports resolved; `from m import a` gives `m` and
    `m.a` too, which is a module when `a` is a submodule."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            names = [f"{module}.{alias.name}" for alias in node.names]
            # `from pdserve import kernels` imports another node than its module names
            other_nodes = [name for name in names if node_of(name) != node_of(module)]
            if len(other_nodes) < len(names) or module != "pdserve":
                yield module
            yield from names


def source_paths(package: str) -> list[Path]:
    """The modules of one node (the top `pdserve` folder's own, not its subfolders'; a package's,
    not those of a node nested in it)."""
    paths = FOLDER_OF[package].glob("*.py" if package == "pdserve" else "**/*.py")
    return sorted(path for path in paths if node_of(module_name(path)) == package)


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importing node, imported node) -> the imports that make the edge, as "module -> name"."""
    edges: dict[tuple[str, str], list[str]] = {}
    paths = sorted(path for package in FOLDER_OF if package != WIRE for path in source_paths(package))
    for path in paths:
        source = node_of(module_name(path))
        for name in imports_of(path):
            target = node_of(name)
            line = f"{module_name(path)} -> {name}"
            if target is not None and target != source and line not in edges.get((source, target), []):
                edges.setdefault((source, target), []).append(line)
    return edges


def find_cycle(nodes: list[str], edges: set[tuple[str, str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None if it is acyclic."""
    successors = {node: sorted(b for a, b in edges if a == node) for node in nodes}
    state = dict.fromkeys(nodes, "new")
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for successor in successors[node]:
            if state[successor] == "open":
                return path[path.index(successor):] + [successor]
            if state[successor] == "new" and (cycle := visit(successor)) is not None:
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in nodes:
        if state[node] == "new" and (cycle := visit(node)) is not None:
            return cycle
    return None


@pytest.fixture(scope="module")
def edges() -> dict[tuple[str, str], list[str]]:
    return package_edges()


def test_the_scan_sees_imports_between_packages(edges):
    assert {("pdserve.gateway", "pdserve.cluster"), ("pdserve.decode_svc", "pdserve.kvtransfer"),
            ("pdserve.engine", "pdserve.kernels"), ("pdserve.cluster", WIRE), ("pdserve", "pdserve.gateway")
            } <= edges.keys()
    assert find_cycle(["a", "b", "c"], {("a", "b"), ("b", "c"), ("c", "a")}) == ["a", "b", "c", "a"]


def test_no_two_top_level_packages_import_each_other_even_through_others(edges):
    cycle = find_cycle(sorted(FLOOR_OF), set(edges))
    assert cycle is None, "import cycle " + " -> ".join(cycle) + "\n" + "\n".join(
        line for a, b in zip(cycle, cycle[1:]) for line in edges[(a, b)])


def heavy_nodes() -> dict[str, list[str]]:
    """Each heavy node -> its imports of torch, triton or cupy, as "module -> name"."""
    heavy: dict[str, list[str]] = {}
    for package in FOLDER_OF:
        for path in source_paths(package):
            for name in imports_of(path):
                if name.split(".")[0] in HEAVY_MODULES:
                    heavy.setdefault(package, []).append(f"{module_name(path)} -> {name}")
    return heavy


def reachable_from(node: str, edges: set[tuple[str, str]]) -> set[str]:
    seen, frontier = {node}, [node]
    while frontier:
        source = frontier.pop()
        new = {b for a, b in edges if a == source} - seen
        seen |= new
        frontier += new
    return seen


def test_the_scan_sees_heavy_nodes_and_what_they_reach(edges):
    heavy = heavy_nodes()
    assert {"pdserve.engine", "pdserve.kernels"} <= heavy.keys()
    assert "pdserve.engine" in reachable_from("pdserve.gateway.colocated", set(edges)) & heavy.keys()
    assert reachable_from("a", {("a", "b"), ("b", "c"), ("d", "a")}) == {"a", "b", "c"}


def test_the_gateway_can_never_reach_torch(edges):
    heavy = heavy_nodes()
    reached = reachable_from("pdserve.gateway", set(edges)) & heavy.keys()
    assert not reached, "the gateway reaches heavy nodes:\n" + "\n".join(
        f"{node}: {line}" for node in sorted(reached) for line in heavy[node])


def test_the_shared_vocabulary_imports_no_grpc():
    offending = [f"{module_name(path)} -> {name}" for path in source_paths("pdserve.protocol")
                 for name in imports_of(path) if name.split(".")[0] == "grpc"]
    assert not offending, "\n".join(offending)


def test_the_replicas_import_nothing_from_the_gateway(edges):
    offending = [line for replica in REPLICAS for line in edges.get((replica, "pdserve.gateway"), [])]
    assert not offending, "\n".join(offending)


def test_every_import_goes_to_a_lower_floor(edges):
    offending = [line for (source, target), lines in sorted(edges.items())
                 if FLOOR_OF[target] <= FLOOR_OF[source] for line in lines]
    assert not offending, "imports of a sibling or a higher floor:\n" + "\n".join(offending)


def test_the_generated_wire_code_imports_nothing_of_ours():
    paths = sorted(FOLDER_OF[WIRE].glob("*.py"))
    assert paths, "generate the gRPC code first (make protos)"
    offending = [f"{module_name(path)} -> {name}" for path in paths for name in imports_of(path)
                 if node_of(name) not in (None, WIRE)]
    assert not offending, "\n".join(offending)


def test_every_import_of_ours_names_the_pdserve_namespace():
    """A bare `import engine` works only from a checkout's root; installed, only `pdserve.*` exists."""
    folders = {folder.name for package, folder in FOLDER_OF.items() if package not in ("pdserve", WIRE)}
    paths = sorted(path for folder in FOLDER_OF.values() for path in folder.rglob("*.py"))
    paths += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "scripts").rglob("*.py"))
    offending = [f"{path.relative_to(ROOT)} -> {name}" for path in paths for name in imports_of(path)
                 if name.split(".")[0] in folders]
    assert not offending, "\n".join(offending)


def test_every_import_of_ours_resolves_on_disk_as_static_tools_read_it():
    """pyright, mypy and editors do not run import hooks: they find `pdserve.engine.config` as
    pdserve/engine/config.py under the repository root (pdserve/engine links to engine/)."""
    paths = sorted(path for package in FOLDER_OF for path in source_paths(package))
    paths += sorted((ROOT / "tests").rglob("*.py"))
    unresolved = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                target = ROOT.joinpath(*name.split("."))
                if (name.split(".")[0] == "pdserve" and not target.with_suffix(".py").is_file()
                        and not (target / "__init__.py").is_file()):
                    unresolved.append(f"{path.relative_to(ROOT)} -> {name}")
    assert len(paths) > 300
    assert not unresolved, "\n".join(unresolved)
