"""What a model folder's config.json sets for the requests it can take, read without the engine.

The gateway checks prompts against these before any replica sees them; the engine reads the same
two keys into its `ModelConfig`, so both refuse the same requests.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pdserve.protocol.errors import InvalidModelError


@dataclass(frozen=True, slots=True)
class ModelLimits:
    vocab_size: int  # token ids are in [0, vocab_size)
    max_model_len: int  # prompt + generated tokens, in tokens

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelLimits:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise InvalidModelError(f"{model_dir}: no config.json (expected a Hugging Face model folder)")
        raw = json.loads(path.read_text())
        try:
            return cls(vocab_size=raw["vocab_size"], max_model_len=raw["max_position_embeddings"])
        except KeyError as exc:
            raise InvalidModelError(f"{path}: no {exc.args[0]}") from None
