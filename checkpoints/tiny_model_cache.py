"""The tiny demo model `pdserve up` serves when no model is given, written once per user cache.

Invariant: the cached folder either does not exist or is complete. The model is written into a
fresh temporary folder beside it and renamed into place in one step, so an interrupted run leaves
only a stray temporary folder (never a half model), and of two concurrent runs one rename wins
and the other discards its copy.
"""
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

TINY_MODEL_NAME = "tiny-llama-v2"


def cache_root(environ: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/pdserve`, or `~/.cache/pdserve` when XDG_CACHE_HOME is unset or empty."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdserve"


def ensure_tiny_model(root: Path) -> Path:
    """Returns `root/models/tiny-llama-v2`, writing the default tiny model there first if absent."""
    from pdserve.checkpoints.tiny_model import write_tiny_model

    model_dir = root / "models" / TINY_MODEL_NAME
    if model_dir.is_dir():
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    logger.info("writing the tiny demo model to %s (once)", model_dir)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".{TINY_MODEL_NAME}.", dir=model_dir.parent))
    try:
        write_tiny_model(staging_dir)
        os.rename(staging_dir, model_dir)
    except OSError:
        # Another run renamed its complete copy into place first; theirs is as good as ours.
        if not model_dir.is_dir():
            raise
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    return model_dir
