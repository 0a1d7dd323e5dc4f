"""The tiny random model that `--model tiny` names, written once per user cache (see user_cache:
the cached folder is complete or absent)."""
import logging
from pathlib import Path

from pdserve.checkpoints.user_cache import cache_root, publish_folder

__all__ = ["TINY_MODEL_NAME", "cache_root", "ensure_tiny_model"]

logger = logging.getLogger(__name__)

TINY_MODEL_NAME = "tiny-llama-v2"


def ensure_tiny_model(root: Path) -> Path:
    """Returns `root/models/tiny-llama-v2`, writing the default tiny model there first if absent."""
    from pdserve.checkpoints.tiny_model import write_tiny_model

    model_dir = root / "models" / TINY_MODEL_NAME
    if not model_dir.is_dir():
        logger.info("writing the tiny demo model to %s (once)", model_dir)
    return publish_folder(model_dir, write_tiny_model)
