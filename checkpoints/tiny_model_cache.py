"""The tiny random model that `--model tiny` names, written once per user cache (see user_cache:
the cached folder is complete or absent).

The writer needs torch, so it runs in a child process (`python -m pdserve.checkpoints.tiny`):
resolving `tiny` loads no torch here, in a gateway as anywhere else.
"""
import logging
import subprocess
import sys
from pathlib import Path

from pdserve.checkpoints.user_cache import cache_root, publish_folder
from pdserve.protocol.errors import InvalidModelError

__all__ = ["TINY_MODEL_NAME", "cache_root", "ensure_tiny_model"]

logger = logging.getLogger(__name__)

TINY_MODEL_NAME = "tiny-llama-v2"
WRITE_TIMEOUT_S = 300.0


def ensure_tiny_model(root: Path) -> Path:
    """Returns `root/models/tiny-llama-v2`, writing the default tiny model there first if absent."""
    model_dir = root / "models" / TINY_MODEL_NAME
    if not model_dir.is_dir():
        logger.info("writing the tiny demo model to %s (once)", model_dir)
    return publish_folder(model_dir, _write_in_child)


def _write_in_child(out_dir: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pdserve.checkpoints.tiny", str(out_dir)],
                            capture_output=True, text=True, timeout=WRITE_TIMEOUT_S)
    if result.returncode != 0:
        raise InvalidModelError(f"writing the tiny model failed: {result.stderr.strip()[-2000:]}")
