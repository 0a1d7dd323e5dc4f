"""The `pdserve` command line: one subcommand per service or tool.

Each subcommand is an `add_<name>` function that declares its flags on its own subparser and
binds a `run_<name>(args) -> exit status` handler with `set_defaults(run=...)`; it is listed
in `SUBCOMMANDS`. Handlers import what they need themselves, so parsing stays cheap and one
subcommand never pays for another's imports (torch, grpc). Logs go to stderr; results a
script may want (paths, ids) go to stdout.
"""
import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path


def run_make_tiny_model(args: argparse.Namespace) -> int:
    from pdserve.tiny_model import TinyModelSpec, write_tiny_model_spec

    given = {field.name: getattr(args, field.name)
             for field in dataclasses.fields(TinyModelSpec) if hasattr(args, field.name)}
    try:
        spec = TinyModelSpec(**given)
    except ValueError as error:
        raise SystemExit(f"pdserve make-tiny-model: {error}") from error
    print(write_tiny_model_spec(args.out_dir, spec))
    return 0


def add_make_tiny_model(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-tiny-model",
        help="write a small random Hugging Face model folder (config, weights, tokenizer)",
        description="Writes a randomly initialised causal LM with a byte-level BPE tokenizer "
                    "trained offline. The same flags give byte-identical weights. Flags left "
                    "out take the defaults of pdserve.tiny_model.TinyModelSpec.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("out_dir", type=Path, metavar="DIR",
                        help="folder to write (created if missing)")
    parser.add_argument("--arch", choices=("llama", "qwen2", "mistral"))
    parser.add_argument("--hidden-size", type=int)
    parser.add_argument("--num-layers", type=int)
    parser.add_argument("--num-heads", type=int, help="query heads")
    parser.add_argument("--num-kv-heads", type=int, help="key/value heads (grouped-query attention)")
    parser.add_argument("--head-dim", type=int, help="default: hidden size / heads")
    parser.add_argument("--intermediate-size", type=int, help="MLP width")
    parser.add_argument("--vocab-size", type=int,
                        help="tokenizer and embedding rows, special tokens included")
    parser.add_argument("--max-position-embeddings", type=int)
    parser.add_argument("--seed", type=int, help="seed of the weight generator")
    parser.add_argument("--init-range", type=float,
                        help="standard deviation of every drawn weight")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="dtype of the saved weights")
    parser.add_argument("--tie-word-embeddings", action="store_true",
                        help="share embed_tokens with lm_head")
    parser.add_argument("--rope-scaling", choices=("llama3",),
                        help="rescale RoPE frequencies as Llama 3.1 does")
    parser.set_defaults(run=run_make_tiny_model)


SUBCOMMANDS = (add_make_tiny_model,)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdserve", description="LLM serving with prefill/decode disaggregation.")
    subparsers = parser.add_subparsers(metavar="COMMAND", required=True)
    for add_subcommand in SUBCOMMANDS:
        add_subcommand(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args)
