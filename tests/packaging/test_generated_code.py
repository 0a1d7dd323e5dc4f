"""The committed wire code protos/pdserve/v1/ (package `pdserve.v1`) is exactly what the protos generate today.

It regenerates into a temporary folder with the pinned grpc_tools and compares file by file, so a
.proto edit without `make protos` fails here rather than on the wire.
"""
import runpy
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATOR = REPO_ROOT / "scripts" / "generate_protos.py"


def _files(package_dir: Path, generator: dict) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in generator["generated_files"](package_dir)}


def test_committed_wire_code_matches_the_protos(tmp_path):
    generator = runpy.run_path(str(GENERATOR))
    expected = _files(generator["generate"](tmp_path), generator)
    committed = _files(REPO_ROOT / "protos" / "pdserve" / "v1", generator)
    stale = sorted(name for name in expected.keys() | committed.keys() if expected.get(name) != committed.get(name))
    assert not stale, f"protos/pdserve/v1 does not match protos/ ({', '.join(stale)}): run `make protos` and commit"
