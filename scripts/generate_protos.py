"""Generates the wire code `pdserve.v1` from protos/pdserve/v1/*.proto with grpc_tools.

    python scripts/generate_protos.py [OUT_ROOT]    # `make protos`; OUT_ROOT: the repository

Writes OUT_ROOT/pdserve/v1/: per proto a `*_pb2.py`, a `*_pb2.pyi` and a `*_pb2_grpc.py`, and
an `__init__.py`. The folder is replaced whole, so a deleted proto leaves no module behind.
The output is committed: a wheel, an sdist or `pip install git+...` then carries it with no
build step, and tests/packaging/test_generated_code.py fails once it no longer matches the protos.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "protos"
PACKAGE = Path("pdserve", "v1")
INIT_TEXT = '"""Generated from protos/pdserve/v1/*.proto by scripts/generate_protos.py; do not edit."""\n'


def generate(out_root: Path) -> Path:
    """Writes out_root/pdserve/v1 afresh and returns that folder."""
    package_dir = out_root / PACKAGE
    shutil.rmtree(package_dir, ignore_errors=True)
    package_dir.mkdir(parents=True)
    protos = sorted(str(path.relative_to(PROTO_ROOT)) for path in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"--python_out={out_root}",
         f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", *protos],
        cwd=PROTO_ROOT, check=True)
    (package_dir / "__init__.py").write_text(INIT_TEXT)
    return package_dir


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT)
