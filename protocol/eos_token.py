"""A model folder's end-of-sequence token id, read from its tokenizer files.

A replica behind a gateway turns no ids into text; of the tokenizer it needs this id alone. Read
from the files, it spares the replica's process transformers and a loaded tokenizer (about
70 MB resident on SmolLM2).

Invariant: the id equals `load_tokenizer(model_dir).eos_token_id`. The files are read directly
only where transformers reads them the same way: tokenizer_config.json names `eos_token`, found
in tokenizer.json, and no legacy file can override it (special_tokens_map.json and
added_tokens.json count only for a config without `added_tokens_decoder`). Any other folder goes
through the tokenizer itself.
"""
from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from pdserve.protocol.tokenizer import load_tokenizer


def eos_token_id(model_dir: str | Path) -> int | None:
    model_dir = Path(model_dir)
    token = _saved_eos_token(model_dir)
    token_id = None
    if token is not None:
        token_id = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(token)
    return load_tokenizer(model_dir).eos_token_id if token_id is None else token_id


def _saved_eos_token(model_dir: Path) -> str | None:
    """The eos token's text as save_pretrained records it, or None where transformers would
    read the folder another way."""
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    legacy_files = ("special_tokens_map.json", "added_tokens.json")
    if "added_tokens_decoder" not in config and any((model_dir / name).exists() for name in legacy_files):
        return None
    if not (model_dir / "tokenizer.json").is_file():
        return None
    token = config.get("eos_token")
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None
