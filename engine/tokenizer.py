"""Loads the tokenizer that ships in a Hugging Face model folder (fast tokenizers only)."""
from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from engine.errors import InvalidModelError


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerFast:
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"{model_dir}: cannot load tokenizer: {exc}") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise InvalidModelError(f"{model_dir}: needs a fast tokenizer (tokenizer.json)")
    return tokenizer
