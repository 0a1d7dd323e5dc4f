"""The per-user cache that resolved models live in, and the one way a folder enters it.

Invariant: a cached folder either does not exist or is complete. `publish_folder` writes into a
fresh temporary folder beside the final one and renames it into place in one step, so an
interrupted run leaves only a stray `.<name>.*` folder (never a half model), and of two concurrent
runs one rename wins and the other discards its copy.
"""
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

logger = logging.getLogger(__name__)


def cache_root(environ: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/pdserve`, or `~/.cache/pdserve` when XDG_CACHE_HOME is unset or empty."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdserve"


def publish_folder(final_dir: Path, write: Callable[[Path], object]) -> Path:
    """Returns `final_dir`, first filling it through `write(staging_dir)` if it does not exist."""
    if final_dir.is_dir():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.", dir=final_dir.parent))
    try:
        write(staging_dir)
        os.rename(staging_dir, final_dir)
    except OSError:
        # Another run renamed its complete copy into place first; theirs is as good as ours.
        if not final_dir.is_dir():
            raise
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    return final_dir
