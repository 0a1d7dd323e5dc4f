"""The model folder a peer engine (vLLM) reads.

A folder converted from a .gguf holds, beside model.safetensors, the file's matrices as stored in
a second safetensors file (checkpoints/gguf_convert.py). vLLM and transformers load every
*.safetensors of a folder as weights, and those blocks would overwrite the float weights (vLLM
refuses the embeddings' shape). A peer therefore gets a folder of links to every other file.

Invariant: the folder returned holds exactly the files of `model_dir` but the blocks file, as
links, so a peer reads the very float weights pdserve dequantizes.
"""
from __future__ import annotations

from pathlib import Path

from pdserve.checkpoints.gguf_convert import BLOCKS_FILE_NAME


def peer_model_dir(model_dir: Path, scratch_dir: Path) -> Path:
    """`model_dir` itself when it holds no blocks file; else a folder under `scratch_dir` (made
    or refreshed) of links to its other files."""
    if not (model_dir / BLOCKS_FILE_NAME).exists():
        return model_dir
    view = scratch_dir / f"{model_dir.name}-float"
    view.mkdir(parents=True, exist_ok=True)
    for stale in view.iterdir():
        stale.unlink()
    for path in model_dir.iterdir():
        if path.name != BLOCKS_FILE_NAME:
            (view / path.name).symlink_to(path.resolve())
    return view
