"""Inside each package the modules import one another without a circle.

Any import statement counts, lazy and type-checking ones too, as between packages
(tests/architecture/test_layering.py): two modules that both need a type take it from a third that
imports neither of them, so each module can be read, and imported, after the ones it names.
"""
import pytest

from tests.architecture.test_layering import FOLDER_OF, find_cycle, imports_of, module_name, source_paths


def module_graph(package: str) -> tuple[list[str], set[tuple[str, str]]]:
    """The modules of `package`, and (importer, imported) for each import between two of them."""
    path_of = {module_name(path): path for path in source_paths(package)}
    edges = {(module, name) for module, path in path_of.items() for name in imports_of(path)
             if name in path_of and name != module}  # an __init__ importing its submodules names itself
    return sorted(path_of), edges


def test_the_scan_sees_imports_between_modules_of_a_package():
    _, gateway = module_graph("pdserve.gateway")
    assert ("pdserve.gateway.disaggregated.main", "pdserve.gateway.front.tokenization") in gateway
    _, kernels = module_graph("pdserve.kernels")
    assert ("pdserve.kernels", "pdserve.kernels.cpu_decode_attention") in kernels  # `from pdserve.kernels import x`
    assert ("pdserve.kernels", "pdserve.kernels.triton_decode_attention") in kernels  # inside a function


@pytest.mark.parametrize("package", sorted(FOLDER_OF))
def test_no_module_imports_itself_through_others(package):
    modules, edges = module_graph(package)
    cycle = find_cycle(modules, edges)
    assert cycle is None, f"import cycle in {package}: " + " -> ".join(cycle)
