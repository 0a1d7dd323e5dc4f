"""A byte-level BPE tokenizer trained offline, for tiny test models.

Invariant: the same vocab size on the same Python gives the same tokenizer. The corpus is the
source text of a fixed, sorted list of standard-library modules read from the running
interpreter, so nothing is downloaded and nothing is cached. Byte level means every UTF-8
string (emoji, CJK) encodes and decodes back unchanged.

Token ids 0..4 are the special tokens, in `SPECIAL_TOKENS` order. Encoding with special tokens
(the transformers default) prepends `<|begin_of_text|>`; the chat template starts with it too,
and `apply_chat_template` encodes without adding another, so a chat prompt holds exactly one.
"""
import logging
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|pad|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN)

NUM_BYTE_TOKENS = 256
MIN_VOCAB_SIZE = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS)

# ChatML turns behind one bos; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Module files under the stdlib folder: about 4 MB of code and docstrings, enough for a
# vocabulary of about 34k tokens. A file some distribution leaves out is skipped.
CORPUS_MODULE_PATHS = tuple(sorted((
    "_pydecimal.py", "_strptime.py", "argparse.py", "ast.py", "asyncio/base_events.py",
    "base64.py", "bisect.py", "calendar.py", "cmd.py", "codecs.py", "collections/__init__.py",
    "colorsys.py", "configparser.py", "contextlib.py", "copy.py", "cProfile.py", "csv.py",
    "dataclasses.py", "datetime.py", "decimal.py", "difflib.py", "dis.py", "doctest.py",
    "email/message.py", "enum.py", "fnmatch.py", "fractions.py", "ftplib.py", "functools.py",
    "gettext.py", "glob.py", "gzip.py", "hashlib.py", "heapq.py", "hmac.py", "html/parser.py",
    "http/client.py", "imaplib.py", "inspect.py", "ipaddress.py", "json/decoder.py",
    "locale.py", "logging/__init__.py", "lzma.py", "bz2.py", "mailbox.py", "mimetypes.py",
    "modulefinder.py", "multiprocessing/pool.py", "numbers.py", "operator.py", "optparse.py",
    "pathlib.py", "pdb.py", "pickle.py", "pkgutil.py", "platform.py", "pprint.py",
    "profile.py", "pstats.py", "queue.py", "quopri.py", "random.py", "re/_parser.py",
    "reprlib.py", "runpy.py", "sched.py", "secrets.py", "selectors.py", "shlex.py",
    "shutil.py", "smtplib.py", "socket.py", "sqlite3/dump.py", "ssl.py", "statistics.py",
    "string.py", "subprocess.py", "sysconfig.py", "tarfile.py", "tempfile.py", "textwrap.py",
    "threading.py", "timeit.py", "tokenize.py", "trace.py", "traceback.py", "typing.py",
    "unittest/case.py", "urllib/parse.py", "urllib/request.py", "uuid.py", "warnings.py",
    "wave.py", "weakref.py", "xml/dom/minidom.py", "xml/etree/ElementTree.py", "zipapp.py",
    "zipfile.py",
)))


def read_corpus() -> list[str]:
    """The training texts: each listed stdlib module this interpreter ships, in sorted order."""
    stdlib_dir = Path(sysconfig.get_paths()["stdlib"])
    paths = [stdlib_dir / name for name in CORPUS_MODULE_PATHS]
    return [path.read_text(encoding="utf-8") for path in paths if path.is_file()]


def train_bpe(vocab_size: int) -> Tokenizer:
    """A byte-level BPE `Tokenizer` with exactly `vocab_size` ids, special tokens first."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}")
    texts = read_corpus()
    num_corpus_chars = sum(len(text) for text in texts)
    logger.info("training byte-level BPE: vocab %d on %d chars of stdlib source",
                vocab_size, num_corpus_chars)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"the corpus supports a vocab of at most {tokenizer.get_vocab_size()} "
                         f"tokens, {vocab_size} were asked for")
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def build_tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer around `train_bpe(vocab_size)`, chat template included."""
    return PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(vocab_size),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def write_tiny_tokenizer(out_dir: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    """Writes tokenizer.json and tokenizer_config.json (chat template inside) to `out_dir`."""
    tokenizer = build_tiny_tokenizer(vocab_size)
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    return tokenizer
