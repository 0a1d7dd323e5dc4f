"""A GGUF's `tokenizer.ggml.*` metadata as tokenizer.json and tokenizer_config.json.

Invariant: the tokenizer encodes every string to the same ids as the one transformers builds from
the same file (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`), and as the checkpoint's
original tokenizer where the file says how that split text (`tokenizer.ggml.pre`). Only
byte-level BPE (`tokenizer.ggml.model == "gpt2"`: SmolLM, Llama 3, Qwen2, GPT-2 style
vocabularies) is built; other models and unknown pre-tokenizers raise GGUFError rather than
tokenizing differently.

Tokens the file marks CONTROL become special added tokens, USER_DEFINED ones plain added tokens,
so text like `<|im_end|>` stays one token. Built with the `tokenizers` library alone (no torch).
"""
from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from pdserve.checkpoints.errors import GGUFError
from pdserve.checkpoints.gguf_file import GGUFFile

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # llama.cpp's token types

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _gpt2_split() -> list[pre_tokenizers.PreTokenizer]:
    return [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]


def _digits_then_gpt2_split() -> list[pre_tokenizers.PreTokenizer]:
    return [pre_tokenizers.Digits(individual_digits=True), *_gpt2_split()]


def _split_then_byte_level(pattern: str) -> list[pre_tokenizers.PreTokenizer]:
    return [pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]


def _llama3_split() -> list[pre_tokenizers.PreTokenizer]:
    return _split_then_byte_level(_LLAMA3_SPLIT)


def _qwen2_split() -> list[pre_tokenizers.PreTokenizer]:
    return _split_then_byte_level(_QWEN2_SPLIT)


# tokenizer.ggml.pre -> how the original tokenizer split text before byte-level BPE.
PRE_TOKENIZERS = {
    "default": _gpt2_split,
    "gpt-2": _gpt2_split,
    "smollm": _digits_then_gpt2_split,
    "llama-bpe": _llama3_split,
    "llama3": _llama3_split,
    "llama-v3": _llama3_split,
    "smaug-bpe": _llama3_split,
    "qwen2": _qwen2_split,
    "deepseek-r1-qwen": _qwen2_split,
}


def build_tokenizer(gguf: GGUFFile) -> Tokenizer:
    """tokenizer.json's pipeline: byte-level BPE over the file's vocabulary and merges."""
    kind = gguf.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.model is {kind!r}; supported: 'gpt2' (byte-level BPE)")
    pre = gguf.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.pre is {pre!r}; supported: {', '.join(PRE_TOKENIZERS)}")
    raw_tokens = gguf.get("tokenizer.ggml.tokens")
    vocab = {token: index for index, token in enumerate(byte_level_tokens(raw_tokens))}
    merges = [tuple(merge.split(" ", 1)) for merge in gguf.get("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                     end_of_word_suffix="", fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(PRE_TOKENIZERS[pre]())
    tokenizer.decoder = decoders.ByteLevel()
    # A token is added whole only as the vocabulary spells it; one marked CONTROL in another
    # spelling is a mislabel that transformers skips too.
    types = gguf.get("tokenizer.ggml.token_type", [NORMAL] * len(raw_tokens))
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True)
                                  for token, kind in zip(raw_tokens, types) if kind == CONTROL and token in vocab])
    tokenizer.add_tokens([AddedToken(token, normalized=False, special=False)
                          for token, kind in zip(raw_tokens, types) if kind == USER_DEFINED and token in vocab])
    tokenizer.post_processor = _post_processor(gguf, raw_tokens)
    return tokenizer


def build_tokenizer_config(gguf: GGUFFile) -> dict:
    """tokenizer_config.json: the special tokens by text, the chat template, BOS/EOS adding."""
    tokens = gguf.get("tokenizer.ggml.tokens")

    def token_text(key: str) -> str | None:
        token_id = gguf.get(f"tokenizer.ggml.{key}", None)
        return tokens[token_id] if token_id is not None else None

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_text("bos_token_id"),
        "eos_token": token_text("eos_token_id"),
        "unk_token": token_text("unknown_token_id"),
        "pad_token": token_text("padding_token_id"),
        "add_bos_token": gguf.get("tokenizer.ggml.add_bos_token", False),
        "add_eos_token": gguf.get("tokenizer.ggml.add_eos_token", False),
        "chat_template": gguf.get("tokenizer.chat_template", None),
        "clean_up_tokenization_spaces": False,
        "model_max_length": gguf.get(f"{gguf.get('general.architecture')}.context_length"),
    }


def byte_level_tokens(tokens: list[str]) -> list[str]:
    """Each token spelled in the byte-level alphabet, as the BPE model looks text up: a few files
    store an added token (e.g. CJK) as plain text, which is respelled from its UTF-8 bytes."""
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    return [token if set(token) <= alphabet else "".join(spelling[byte] for byte in token.encode("utf-8"))
            for token in tokens]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the byte-level alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [byte for byte in range(256) if byte not in printable]
    return {**{byte: chr(byte) for byte in printable},
            **{byte: chr(256 + index) for index, byte in enumerate(shifted)}}


def _post_processor(gguf: GGUFFile, tokens: list[str]) -> processors.TemplateProcessing:
    """BOS and EOS added around each sequence as the file asks (transformers' own template)."""
    bos_id = gguf.get("tokenizer.ggml.bos_token_id", None)
    eos_id = gguf.get("tokenizer.ggml.eos_token_id", None)
    add_bos = gguf.get("tokenizer.ggml.add_bos_token", False) and bos_id is not None
    add_eos = gguf.get("tokenizer.ggml.add_eos_token", False) and eos_id is not None
    bos, eos = (tokens[bos_id] if add_bos else None), (tokens[eos_id] if add_eos else None)
    single = f"{f'{bos}:0 ' if add_bos else ''}$A:0{f' {eos}:0' if add_eos else ''}"
    pair = f"{single}{f' {bos}:1' if add_bos else ''} $B:1{f' {eos}:1' if add_eos else ''}"
    special_tokens = [*([(bos, bos_id)] if add_bos else []), *([(eos, eos_id)] if add_eos else [])]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special_tokens)
