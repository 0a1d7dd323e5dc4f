"""Structured outputs compiled against one tokenizer, with llguidance.

Invariant: `check` accepts exactly the constraints `matcher` can build, so a request the gateway
let through never fails to compile on a replica of the same model. A constraint is compiled once
per compiler (an LRU cache keyed by the hashable `StructuredOutput`); each request gets a copy of
the compiled matcher, whose state is the tokens it has consumed.

Why llguidance: it computes a token mask from the grammar's current state lazily (an Earley
parser over a token trie, tens of microseconds a token for JSON schemas), so a new schema costs
about a millisecond to compile instead of a precomputed table, it runs on CPU beside any
accelerator, and the wheel has no dependencies.

JSON is generated with the separators `json.dumps` writes (", " and ": ") and no other
whitespace: a schema gives the model one way to write each value, so it cannot spend its tokens on
indentation that never ends.
"""
from __future__ import annotations

import functools
import json

import llguidance
import llguidance.hf
from llguidance.gbnf_to_lark import gbnf_to_lark

from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.structured_output import StructuredOutput

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY_OBJECT = '{"type": "object"}'
CACHED_GRAMMARS = 256


def grammar_text(constraint: StructuredOutput) -> str:
    """The constraint as an llguidance grammar (its JSON form, or Lark)."""
    match constraint.kind:
        case "json":
            return llguidance.LLMatcher.grammar_from_json_schema(constraint.json, defaults=JSON_LAYOUT)
        case "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(_ANY_OBJECT, defaults=JSON_LAYOUT)
        case "regex":
            return llguidance.LLMatcher.grammar_from_regex(constraint.regex)
        case "choice":
            return llguidance.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(choice) for choice in constraint.choice))
        case "grammar":
            text = constraint.grammar
            return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(text) if "::=" in text else text)
    raise AssertionError(constraint.kind)


class GrammarCompiler:
    """`vocab_size`: the model's logits width, which may exceed the tokenizer's (padded
    embeddings; such ids are never allowed). `eos_token_id`: the id that ends a finished output."""

    def __init__(self, tokenizer, vocab_size: int | None = None, eos_token_id: int | None = None):
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos_token_id)
        self.vocab_size = self.tokenizer.vocab_size
        self._compiled = functools.lru_cache(maxsize=CACHED_GRAMMARS)(self._compile)

    def check(self, constraint: StructuredOutput) -> None:
        """Raises InvalidRequestError, with llguidance's reason, unless the constraint compiles."""
        self._compiled(constraint)

    def matcher(self, constraint: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher, at the start of the output."""
        return self._compiled(constraint).deep_copy()

    def _compile(self, constraint: StructuredOutput) -> llguidance.LLMatcher:
        try:
            grammar = grammar_text(constraint)
        except ValueError as exc:
            raise InvalidRequestError(f"structured output ({constraint.kind}): {exc}") from None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"structured output ({constraint.kind}) does not compile: "
                                      f"{matcher.get_error().strip()}")
        return matcher
