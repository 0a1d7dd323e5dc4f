"""Incremental detokenization: token ids in, text deltas out, never half a character.

Layout of the token list, prompt then output, and the two offsets that walk along it:

    [ ... prompt context ... | emitted output ...... | tokens not yet emitted ]
                    prefix_offset          read_offset                       end

Each push decodes only the window [prefix_offset, end). The text of [prefix_offset, read_offset)
was emitted already; whatever the window decodes to beyond it is the new delta, unless it ends
in U+FFFD, the replacement a byte-level decoder produces for a character whose remaining bytes
have not arrived yet. Then the delta is held back and the window grows until it completes. When
a delta is emitted, prefix_offset moves to the old read_offset and read_offset to the end, so
the window stays a few tokens wide. Keeping the previous tokens in the window (and, at the
start, a few prompt tokens) gives decoders that strip a leading space from the first token of
a decode (SentencePiece's Metaspace) the context they need to keep it.

Guarantee, for byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2): the deltas from `push` plus
`finish()` concatenate to `tokenizer.decode(output_ids, skip_special_tokens=True)`, and a delta
contains U+FFFD only where that full decode does. It holds because the window only advances at
a point where the decoded text ends in a complete character, and UTF-8 decoding restarts cleanly
there. The prompt is used as context only when it ends on such a point too; otherwise (a prompt
given as ids that stops mid-character) the output is decoded on its own.

Caveats: text ending in a genuine U+FFFD is held back until the next token or `finish()`; a
run of invalid bytes is held back until a valid character follows it. For SentencePiece
tokenizers the output keeps the leading space the prompt context implies, as vLLM does, so it
can differ from decoding the output ids alone by that space. Decoding never applies
`clean_up_tokenization_spaces`, whose rewrites look across token boundaries.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

_REPLACEMENT_CHAR = "\ufffd"
_NUM_PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerFast, prompt_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._token_ids = list(prompt_token_ids)
        self._read_offset = len(self._token_ids)
        self._prefix_offset = max(self._read_offset - _NUM_PROMPT_CONTEXT_TOKENS, 0)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        if self._prefix_text.endswith(_REPLACEMENT_CHAR):
            self._prefix_offset = self._read_offset
            self._prefix_text = ""
        self._text = ""
        self._finished = False

    @property
    def text(self) -> str:
        """All output text emitted so far (the concatenation of the returned deltas)."""
        return self._text

    def push(self, token_ids: Sequence[int]) -> str:
        """Append newly generated tokens; return the text they complete (possibly "")."""
        if self._finished:
            raise RuntimeError("push() after finish(): the detokenizer's sequence has ended")
        self._token_ids.extend(token_ids)
        window_text = self._decode(self._prefix_offset, len(self._token_ids))
        if window_text.endswith(_REPLACEMENT_CHAR):
            return ""
        return self._emit(window_text)

    def finish(self) -> str:
        """Flush text held back at the end of the sequence (an incomplete or invalid tail)."""
        if self._finished:
            return ""
        self._finished = True
        return self._emit(self._decode(self._prefix_offset, len(self._token_ids)))

    def _emit(self, window_text: str) -> str:
        delta = window_text[len(self._prefix_text):]
        if not delta:
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._token_ids)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        self._text += delta
        return delta

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(
            self._token_ids[start:end],
            skip_special_tokens=True,
            clean_up_tokenization_spaces=False,
        )
