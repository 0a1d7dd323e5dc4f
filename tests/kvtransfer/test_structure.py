"""The transfer layer's shape as a specification: no import cycle inside kvtransfer, and each
transport module holds both of its ends (its part of a KVTarget and its sender)."""
import ast
from pathlib import Path

import pytest

from pdserve.kvtransfer import cuda_ipc, grpc_stream, shm

PACKAGE = Path(__file__).resolve().parents[2] / "kvtransfer"


def kvtransfer_imports(path: Path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvtransfer"):
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names if alias.name.startswith("kvtransfer"))
    return imported


def test_kvtransfer_has_no_import_cycle():
    modules = {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in PACKAGE.rglob("*.py")
    }
    graph = {name: kvtransfer_imports(path) & set(modules) - {name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        assert name not in stack, "import cycle: " + " -> ".join((*stack, name))
        if name not in done:
            for imported in graph[name]:
                visit(imported, (*stack, name))
            done.add(name)

    for name in graph:
        visit(name, ())


@pytest.mark.parametrize(
    ("module", "sender", "streams_layers"),
    [(shm, shm.ShmSender, False), (cuda_ipc, cuda_ipc.CudaIpcSender, False), (grpc_stream, grpc_stream.GrpcSender, True)],
)
def test_each_transport_module_holds_its_target_fields_and_its_sender(module, sender, streams_layers):
    assert callable(module.target_fields)
    assert sender.__module__ == module.__name__ and sender.streams_layers is streams_layers
