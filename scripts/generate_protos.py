"""Generates the wire code `pdserve.v1` beside its sources, protos/pdserve/v1/*.proto.

    python scripts/generate_protos.py [OUT_ROOT]    # `make protos`; OUT_ROOT: protos/

Writes OUT_ROOT/pdserve/v1/: per proto a `*_pb2.py`, a `*_pb2.pyi` and a `*_pb2_grpc.py`, and an
`__init__.py`, replacing every generated file, so a deleted proto leaves no module behind. The
output is committed (a wheel or `pip install git+...` carries it with no build step) and installs
as the package `pdserve.v1`; tests/packaging/test_generated_code.py fails once it no longer
matches the protos.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[1] / "protos"
PACKAGE = Path("pdserve", "v1")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
INIT_TEXT = '"""Generated from protos/pdserve/v1/*.proto by scripts/generate_protos.py; do not edit."""\n'


def generated_files(package_dir: Path) -> list[Path]:
    return sorted(path for path in package_dir.iterdir()
                  if path.name == "__init__.py" or path.name.endswith(GENERATED_SUFFIXES))


def generate(out_root: Path) -> Path:
    """Writes the generated files of out_root/pdserve/v1 afresh and returns that folder."""
    package_dir = out_root / PACKAGE
    package_dir.mkdir(parents=True, exist_ok=True)
    for path in generated_files(package_dir):
        path.unlink()
    protos = sorted(str(path.relative_to(PROTO_ROOT)) for path in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"--python_out={out_root}",
                    f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", *protos], cwd=PROTO_ROOT, check=True)
    (package_dir / "__init__.py").write_text(INIT_TEXT)
    return package_dir


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)
