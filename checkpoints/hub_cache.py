"""A Hugging Face hub id (`org/name`) as a snapshot folder in huggingface_hub's cache.

    <hub cache>/models--org--name/refs/main            the commit `main` points at
    <hub cache>/models--org--name/snapshots/<commit>/  config.json, *.safetensors, tokenizer files

Invariant: offline (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE), nothing is fetched and a snapshot not
in the cache is a ModelNotFoundError naming the id and the cache folder; online, the files a
model folder needs are fetched into the same cache first, as `hf download` would. The cache
folder and the offline switch are read from the environment given, with huggingface_hub's own
precedence, so a caller (or a test) that passes another environment gets another cache.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from pdserve.checkpoints.errors import DownloadError, ModelNotFoundError

MODEL_FILE_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_TRUE_WORDS = ("1", "true", "yes", "on")


def looks_like_hub_id(text: str) -> bool:
    """`org/name`: one slash, neither side empty, not a relative path like `./x` or `../x`."""
    return _HUB_ID.fullmatch(text) is not None and not text.startswith(".")


def hub_cache_dir(environ: Mapping[str, str]) -> Path:
    """HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(key):
            return Path(environ[key]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    xdg_cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache).expanduser() / "huggingface" / "hub"


def is_offline(environ: Mapping[str, str]) -> bool:
    return any(environ.get(key, "").strip().lower() in _TRUE_WORDS
               for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def resolve_hub_id(repo_id: str, environ: Mapping[str, str]) -> Path:
    """The snapshot folder of `repo_id` at `main`, fetched first unless offline."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    cache_dir = hub_cache_dir(environ)
    offline = is_offline(environ)
    try:
        snapshot = Path(snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=offline,
                                          allow_patterns=MODEL_FILE_PATTERNS))
    except RepositoryNotFoundError as error:
        raise ModelNotFoundError(f"{repo_id}: no such model on the Hugging Face hub (or it needs a token)") from error
    except LocalEntryNotFoundError as error:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached"
        raise ModelNotFoundError(f"{repo_id} is not in the Hugging Face cache at {cache_dir} and {why}; "
                                 f"fetch it with `hf download {repo_id}` where the hub is reachable") from error
    except (HfHubHTTPError, OSError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DownloadError(f"{repo_id}: cannot fetch from the Hugging Face hub: {first_line}") from error
    if not (snapshot / "config.json").is_file():
        raise ModelNotFoundError(f"{repo_id}: its snapshot {snapshot} has no config.json "
                                 "(for a GGUF repository, pass the path of its .gguf file)")
    return snapshot
