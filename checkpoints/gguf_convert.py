"""A .gguf file converted once into an ordinary Hugging Face folder in the user cache.

    <cache>/checkpoints/<file stem>-<sha256[:12] of the file>-v<FOLDER_VERSION>/
        config.json              LlamaForCausalLM or Qwen2ForCausalLM (gguf_config)
        generation_config.json   end-of-text and end-of-turn ids
        model.safetensors        every tensor dequantized to float32, llama's q/k rows unpermuted (gguf_weights)
        blocks.safetensors       the Q8_0/Q4_0/Q4_1/Q4_K/Q6_K matrices again, as stored: their blocks (gguf_weights)
        tokenizer.json           byte-level BPE from tokenizer.ggml.* (gguf_tokenizer)
        tokenizer_config.json    special tokens and the chat template

Invariant: the folder is keyed by the file's content, and is complete or absent (user_cache), so
every service and every later run loads it as an HF folder without the .gguf (transformers reads
model.safetensors; pdserve serves the matrices of blocks.safetensors as stored, the rest from
model.safetensors); the name's version changes whenever the folder's contents do; nothing here
imports torch (safetensors' numpy writer), so the gateway may resolve a .gguf too. Everything is
checked before the first byte of weights is written: a file this converter cannot reproduce
faithfully raises GGUFError and leaves no folder.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from safetensors.numpy import save_file
from tqdm import tqdm

from pdserve.checkpoints.errors import GGUFError, ModelNotFoundError
from pdserve.checkpoints.gguf_config import build_config, build_generation_config
from pdserve.checkpoints.gguf_file import GGUFFile
from pdserve.checkpoints.gguf_tokenizer import build_tokenizer, build_tokenizer_config
from pdserve.checkpoints.gguf_weights import hf_blocks, hf_weights
from pdserve.checkpoints.user_cache import publish_folder

logger = logging.getLogger(__name__)

WEIGHTS_FILE_NAME = "model.safetensors"
BLOCKS_FILE_NAME = "blocks.safetensors"
# The blocks file's safetensors "format": the engine tells it from a file of weights by this tag,
# and reads each tensor's block type from the metadata under the tensor's name.
BLOCKS_FORMAT = "gguf-blocks"
HASH_CHUNK_BYTES = 1 << 24
SHORT_SHA_CHARS = 12
FOLDER_VERSION = 3  # 2: blocks.safetensors; 3: Q4_K and Q6_K in it


def folder_name(stem: str, sha256: str) -> str:
    return f"{stem}-{sha256[:SHORT_SHA_CHARS]}-v{FOLDER_VERSION}"


def converted_dir(root: Path, gguf_path: Path, sha256: str) -> Path:
    return root / "checkpoints" / folder_name(gguf_path.stem, sha256)


def ensure_converted(gguf_path: str | Path, root: Path) -> Path:
    """The cached HF folder of `gguf_path`, converting the file first if this content is new."""
    gguf_path = Path(gguf_path)
    model_dir = converted_dir(root, gguf_path, file_sha256(gguf_path))
    return publish_folder(model_dir, lambda staging_dir: convert_gguf(gguf_path, staging_dir))


def convert_gguf(gguf_path: str | Path, out_dir: Path) -> Path:
    """Writes the HF folder of `gguf_path` into `out_dir` (which must exist) and returns it."""
    started_s = time.monotonic()
    gguf = GGUFFile(gguf_path)
    tokenizer = build_tokenizer(gguf)
    config = build_config(gguf, tied_embeddings="output.weight" not in gguf.tensor_names)
    if tokenizer.get_vocab_size(with_added_tokens=True) > config["vocab_size"]:
        raise GGUFError(f"{gguf.path}: {tokenizer.get_vocab_size()} tokens but {config['vocab_size']} embedding rows")
    weights = dict(tqdm(hf_weights(gguf, config), total=len(gguf.tensor_names), desc=f"converting {gguf.path.name}",
                        unit="tensor", disable=None))
    save_file(weights, out_dir / WEIGHTS_FILE_NAME, metadata={"format": "pt"})
    blocks, block_types = {}, {}
    for name, (block_type, values) in hf_blocks(gguf, config):
        blocks[name], block_types[name] = values, block_type
    save_file(blocks, out_dir / BLOCKS_FILE_NAME, metadata={"format": BLOCKS_FORMAT, **block_types})
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", build_tokenizer_config(gguf))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", build_generation_config(gguf, gguf.get("tokenizer.ggml.tokens")))
    logger.info("converted %s (%d tensors) in %.1f s", gguf.path, len(weights), time.monotonic() - started_s)
    return out_dir


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while chunk := file.read(HASH_CHUNK_BYTES):
                digest.update(chunk)
    except FileNotFoundError as error:
        raise ModelNotFoundError(f"{path}: no such file") from error
    return digest.hexdigest()


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
