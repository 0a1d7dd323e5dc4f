"""Loads the tokenizer that ships in a Hugging Face model folder (fast tokenizers only).

The folder's `tokenizer.json` is read as it is, with the special tokens and chat template of
`tokenizer_config.json`: the pipeline the checkpoint saved, whatever `tokenizer_class` it names.
Going through `AutoTokenizer` instead would import the model-config machinery of transformers,
and with it torch, which the gateway never loads.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pdserve.protocol.errors import InvalidModelError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast  # here: a replica that reads only the eos id never imports it

    if not (Path(model_dir) / "tokenizer.json").is_file():
        raise InvalidModelError(f"{model_dir}: needs a fast tokenizer (tokenizer.json)")
    try:
        return PreTrainedTokenizerFast.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"{model_dir}: cannot load tokenizer: {exc}") from exc
