"""A .gguf file opened for reading: its metadata as plain Python values, its tensors as float32.

Invariant: what leaves this module is checked. A file that is not GGUF, is cut short, or holds a
tensor type outside `SUPPORTED_TYPES` raises `GGUFError` naming the file and what is wrong, never
the gguf package's own errors. Dequantizing is the gguf package's numpy code (`gguf.quants`),
the same that transformers' GGUF loading calls, so both see bit-identical float32 weights; every
supported type widens to float32 exactly.

Shapes: GGUF lists a tensor's dimensions fastest-moving first (`[in_features, out_features]`);
`read_tensor` returns numpy (torch) order, `[out_features, in_features]`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

from pdserve.checkpoints.errors import GGUFError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
SUPPORTED_TYPES = frozenset({
    GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
})
# The types pdserve serves as stored; Q5_K is only ever dequantized (it has no kernel).
BLOCK_TYPES = {GGMLQuantizationType.Q8_0: "q8_0", GGMLQuantizationType.Q4_0: "q4_0",
               GGMLQuantizationType.Q4_1: "q4_1", GGMLQuantizationType.Q4_K: "q4_k",
               GGMLQuantizationType.Q6_K: "q6_k"}
_MISSING = object()


class GGUFFile:
    """Metadata and tensors of one .gguf file (memory-mapped: a tensor is read when asked for)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFoundError(f"{self.path}: no such file")
        with self.path.open("rb") as file:
            if file.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise GGUFError(f"{self.path}: not a GGUF file (it does not start with the GGUF magic bytes)")
        try:
            self._reader = GGUFReader(self.path)
        except (ValueError, IndexError, OverflowError, UnicodeDecodeError) as error:
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF file ({error})") from error
        self._tensors = {tensor.name: tensor for tensor in self._reader.tensors}
        self._check_tensors()

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The metadata value under `key`; a missing key raises GGUFError unless `default` is given."""
        field = self._reader.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise GGUFError(f"{self.path}: no {key!r} in its metadata")
            return default
        return field.contents()

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Numpy order: `[out_features, in_features]` for a matrix."""
        return tuple(int(dim) for dim in reversed(self._tensor(name).shape))

    def read_tensor(self, name: str) -> np.ndarray:
        """The tensor `name`, dequantized to float32, in numpy order."""
        tensor = self._tensor(name)
        values = dequantize(tensor.data, tensor.tensor_type)
        return np.ascontiguousarray(values.reshape(self.tensor_shape(name)), dtype=np.float32)

    def block_type(self, name: str) -> str | None:
        """The block format `name` is stored in, when pdserve can serve it as stored ("q8_0",
        "q4_0", "q4_1": a matrix of rows of 32-weight blocks; "q4_k", "q6_k": of 256-weight
        super-blocks); None for any other type."""
        tensor = self._tensor(name)
        return BLOCK_TYPES.get(tensor.tensor_type) if len(tensor.shape) == 2 else None

    def read_blocks(self, name: str) -> np.ndarray:
        """The raw blocks of a matrix `block_type` names: uint8 [out_features, row bytes], each row
        its blocks back to back, as stored."""
        return np.ascontiguousarray(self._tensor(name).data, dtype=np.uint8)

    def _tensor(self, name: str) -> ReaderTensor:
        if name not in self._tensors:
            raise GGUFError(f"{self.path}: no tensor {name}")
        return self._tensors[name]

    def _check_tensors(self) -> None:
        num_file_bytes = self.path.stat().st_size
        for tensor in self._tensors.values():
            if tensor.tensor_type not in SUPPORTED_TYPES:
                supported = ", ".join(sorted(kind.name for kind in SUPPORTED_TYPES))
                raise GGUFError(f"{self.path}: tensor {tensor.name} is {tensor.tensor_type.name}, "
                                f"which is not supported (supported: {supported})")
            if tensor.data_offset + tensor.n_bytes > num_file_bytes:
                raise GGUFError(f"{self.path}: truncated GGUF file (tensor {tensor.name} ends past its end)")
