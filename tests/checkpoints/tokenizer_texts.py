"""Texts on which two tokenizers must agree: whitespace runs, code, digits, scripts and emoji,
special tokens inside text, and a chat with a system turn."""

TEXTS = [
    "", "hello world", "Hello, World!", "  leading and  double  spaces", "trailing space ",
    "tabs\tand\nnew\n\nlines",
    "def f(x):\n    return x ** 2  # comment\n", "1234567890 3.14159 -42 1e-9", "x² + y³", "don't we'll I'd they're",
    "ünïcödé façade naïve", "日本語のテキスト", "中文 分词", "emoji 🙂🚀 and ZWJ 👩‍💻", "<|im_start|>user\nhi<|im_end|>\n",
    "<|begin_of_text|>text<|end_of_text|>", "<|im_end|><|im_end|>", "http://example.com/a?b=c&d=e",
    "CamelCaseIdentifier snake_case_name", "\r\n windows line", "a" * 300,
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"}]
