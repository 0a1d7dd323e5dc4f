"""What a request's output must match: a JSON schema, any JSON object, a regular expression, one
of a list of strings, or a grammar (Lark, or GBNF as llama.cpp and vLLM take it).

Invariant: a `StructuredOutput` that exists names exactly one constraint and is well-formed as
data (the schema is a JSON object, kept as compact JSON text in its own key order; the choices are
non-empty strings). Whether it compiles
against a vocabulary is checked where the tokenizer is known (`protocol/grammar_compiler.py`),
by the gateway before any KV is reserved and by an engine on admission. The value is hashable
(the schema is kept as its JSON text), so compiled grammars are cached by it.

These are vLLM's `structured_outputs` fields (`json`, `json_object`, `regex`, `choice`,
`grammar`); the OpenAI front maps `response_format`, `tools` and vLLM's `guided_*` onto them.
"""
import json
from dataclasses import dataclass

from pdserve.protocol.errors import InvalidRequestError

CONSTRAINTS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    json: str | None = None  # a JSON schema as compact JSON text (a dict or any JSON text is accepted)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] = ()  # exactly one of these strings
    grammar: str | None = None  # Lark, or GBNF (told apart by its `::=` rules)

    def __post_init__(self) -> None:
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False, ())]
        if len(given) != 1:
            raise InvalidRequestError(
                f"structured output: give exactly one of {', '.join(CONSTRAINTS)} (got {given or 'none'})")
        if self.json is not None:
            object.__setattr__(self, "json", json.dumps(_schema(self.json), separators=(",", ":")))
        if self.json_object is not True and self.json_object is not False:
            raise InvalidRequestError(f"structured output: json_object={self.json_object!r}: must be a bool")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(f"structured output: {name}={value!r}: must be a non-empty string")
        if not all(isinstance(choice, str) and choice for choice in self.choice):
            raise InvalidRequestError(f"structured output: choice={list(self.choice)!r}: "
                                      "must be a list of non-empty strings")

    @property
    def kind(self) -> str:
        """The one constraint given, by its field name."""
        return next(name for name in CONSTRAINTS if getattr(self, name) not in (None, False, ()))


def _schema(value: object) -> dict:
    """A schema given as a dict or as JSON text, as a dict."""
    schema = value
    if isinstance(value, str):
        try:
            schema = json.loads(value)
        except ValueError as exc:
            raise InvalidRequestError(f"structured output: json is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"structured output: json={value!r}: must be a JSON schema (an object)")
    return schema
