"""What `--model` names, resolved to a local Hugging Face folder and the id clients call it by.

    (no flag)             the default model, SmolLM2-135M-Instruct (default_model)
    tiny                  the random tiny test model (tiny_model_cache)
    an existing folder    served as it is
    a file (*.gguf)       converted once into the user cache (gguf_convert)
    org/name              a hub id: its snapshot in huggingface_hub's cache (hub_cache)

Invariant: the result is a folder every service loads the same way (config.json, *.safetensors,
tokenizer files), and anything that cannot be served raises a CheckpointError whose message is
one line. A local path wins over a hub id of the same spelling, as in transformers. Only `tiny`
imports torch, and only to write the tiny model the first time.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pdserve.checkpoints.errors import ModelNotFoundError
from pdserve.checkpoints.user_cache import cache_root

TINY = "tiny"
MODEL_HELP = ("a Hugging Face model folder, a .gguf file, a hub id (org/name, from the Hugging Face cache) or "
              f"{TINY!r} (the random test model); default: SmolLM2-135M-Instruct, fetched once into the user cache")


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    model_dir: Path  # a Hugging Face folder
    served_name: str  # the model id clients name in requests


def resolve_model(model: str | None, environ: Mapping[str, str]) -> ResolvedModel:
    """The folder and served id of `model` (None: the default model); see the module docstring."""
    root = cache_root(environ)
    if model is None:
        from pdserve.checkpoints.default_model import DEFAULT_MODEL_ID, ensure_default_model

        return ResolvedModel(ensure_default_model(root, environ), DEFAULT_MODEL_ID)
    if model == TINY:
        from pdserve.checkpoints.tiny_model_cache import TINY_MODEL_NAME, ensure_tiny_model

        return ResolvedModel(ensure_tiny_model(root), TINY_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_dir():
        return ResolvedModel(path, path.name or path.resolve().name)
    if path.is_file():
        from pdserve.checkpoints.gguf_convert import ensure_converted

        return ResolvedModel(ensure_converted(path, root), path.stem)
    from pdserve.checkpoints.hub_cache import looks_like_hub_id, resolve_hub_id

    if looks_like_hub_id(model) and not model.endswith(".gguf"):
        return ResolvedModel(resolve_hub_id(model, environ), model)
    raise ModelNotFoundError(f"{model}: no such model folder or .gguf file, and not a hub id (org/name) "
                             f"or {TINY!r}")
