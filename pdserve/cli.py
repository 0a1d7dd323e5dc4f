"""The `pdserve` command line: one subcommand per service or tool.

Each subcommand is an `add_<name>` function that declares its flags on its own subparser and
binds a `run_<name>(args) -> exit status` handler with `set_defaults(run=...)`; it is listed
in `SUBCOMMANDS`. Handlers import what they need themselves, so parsing stays cheap and one
subcommand never pays for another's imports (torch, grpc). The service subcommands (prefill,
decode, gateway) take their flags from the service's own `main.add_arguments`, declared only
when that subcommand is parsed (see `_LazyArgumentParser`). Logs go to stderr; results a
script may want (paths, ids, generated text, endpoints) go to stdout.
"""
import argparse
import importlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pdserve.checkpoints.errors import CheckpointError
from pdserve.checkpoints.model_ref import MODEL_HELP
from pdserve.cluster.routing_policies import ROUTING_POLICIES
from pdserve.engine.step_budget import DEFAULT_MAX_STEP_MS
from pdserve.gateway.disaggregated.prefill_line import ORDERS
from pdserve.gateway.disaggregated.prefill_placement import PLACEMENTS
from pdserve.gateway.front.tool_parsers import DEFAULT_TOOL_CALL_PARSER, TOOL_CALL_PARSERS
from pdserve.protocol.transport_choice import TRANSPORT_NAMES

DEFAULT_GATEWAY_GRPC_PORT = 50051
DEFAULT_GATEWAY_HTTP_PORT = 8000
CERT_NAMES = ("gateway", "prefill", "decode")  # `pdserve certs`' certificates: one per service
CERT_SHARED_HOST = "pdserve-internal"  # what they name where replicas' addresses are not known when they are made
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # engine.engine_config.DTYPES, less "auto"; parsing loads no engine
QUANTIZATIONS = ("int8", "int4", "w8a8")  # engine.engine_config.QUANTIZATIONS
KV_CACHE_DTYPES = ("auto", "int8")  # engine.engine_config.KV_CACHE_DTYPES
QUANTIZED_WEIGHTS = ("dequantized", "as-stored", "as-stored-int8-activations", "as-stored-int8-prefill")  # engine.engine_config.QUANTIZED_WEIGHTS


class _LazyArgumentParser(argparse.ArgumentParser):
    """A subparser whose flags may come from a `declare_arguments(parser)` function that runs
    the first time this parser parses, so building the whole `pdserve` parser imports no
    service module (and with it torch); `pdserve prefill --help` still lists every flag."""

    def __init__(self, *args, declare_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self._declare_arguments = declare_arguments

    def parse_known_args(self, args=None, namespace=None):
        if self._declare_arguments is not None:
            declare, self._declare_arguments = self._declare_arguments, None
            declare(self)
        return super().parse_known_args(args, namespace)


def run_make_tiny_model(args: argparse.Namespace) -> int:
    from pdserve.checkpoints.tiny.model import TinyModelSpec, write_tiny_model_spec

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
                    "out take the defaults of pdserve.checkpoints.tiny.model.TinyModelSpec.",
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
    parser.add_argument("--dtype", choices=DTYPE_NAMES,
                        help="dtype of the saved weights")
    parser.add_argument("--tie-word-embeddings", action="store_true",
                        help="share embed_tokens with lm_head")
    parser.add_argument("--rope-scaling", choices=("llama3",),
                        help="rescale RoPE frequencies as Llama 3.1 does")
    parser.set_defaults(run=run_make_tiny_model)


def run_model_fetch(args: argparse.Namespace) -> int:
    from pdserve.checkpoints.model_ref import resolve_model

    print(resolve_model(args.model, os.environ).model_dir)
    return 0


def add_model(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "model", help="get a model ready to serve ahead of time (fetch, convert)",
        description="Model housekeeping. `pdserve model fetch` resolves a --model value now, "
                    "downloading and converting what it needs into the user cache, so that "
                    "later starts need no network.")
    actions = parser.add_subparsers(metavar="ACTION", required=True)
    fetch = actions.add_parser(
        "fetch", help="fetch and convert a model into the cache; print its folder",
        description="Resolves MODEL as `pdserve up --model MODEL` would and prints the local "
                    "Hugging Face folder that will be served.")
    fetch.add_argument("model", nargs="?", default=None, metavar="MODEL", help=MODEL_HELP)
    fetch.set_defaults(run=run_model_fetch)


def run_up(args: argparse.Namespace) -> int:
    from pdserve.up import UpConfig, run_up

    config = UpConfig(
        model=args.model, num_prefill=args.prefill, num_decode=args.decode,
        redis_url=args.redis_url, transport=args.transport, device=args.device, dtype=args.dtype,
        quantized_weights=args.quantized_weights, quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        enforce_eager=args.enforce_eager, host=args.host,
        grpc_port=args.grpc_port, http_port=args.http_port, api_keys=tuple(args.api_key or ()),
        startup_timeout_s=args.startup_timeout_s, shutdown_timeout_s=args.shutdown_timeout_s,
        enable_prefix_caching=args.enable_prefix_caching, routing=args.routing, migration_limit=args.migration_limit,
        prefill_placement=args.prefill_placement, line_order=args.line_order, max_step_ms=args.max_step_ms,
        prefill_gpus=args.prefill_gpus, decode_gpus=args.decode_gpus, gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory, internal_tls=args.internal_tls,
        tool_call_parser=args.tool_call_parser, lend_idle_cpus=args.lend_idle_cpus)
    return run_up(config, out=sys.stdout, log=sys.stderr)


def add_up(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "up",
        help="run the whole system locally: Redis, prefill and decode replicas, the gateway",
        description="Starts Redis (unless --redis-url), N prefill and M decode replicas and the "
                    "gateway as child processes, waits until all are healthy, prints the "
                    "endpoints, and stops everything on Ctrl-C. With no --model it serves "
                    "SmolLM2-135M-Instruct, fetched once into the user cache.")
    parser.add_argument("--model", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument("--prefill", type=_positive_int, default=1, metavar="N",
                        help="prefill replicas (default 1)")
    parser.add_argument("--decode", type=_positive_int, default=1, metavar="M",
                        help="decode replicas (default 1)")
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--transport", choices=("auto", *TRANSPORT_NAMES), default="auto",
                        help="how KV blocks move from prefill to decode (default auto)")
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda (each replica on its own GPU while there are enough) or cuda:N "
                             "(all on GPU N) (default cpu)")
    parser.add_argument("--prefill-gpus", type=_index_list, metavar="LIST",
                        help="with --device cuda: the GPU of each prefill replica, e.g. 0,1")
    parser.add_argument("--decode-gpus", type=_index_list, metavar="LIST",
                        help="with --device cuda: the GPU of each decode replica, e.g. 2,3")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="FRACTION",
                        help="on CUDA: the share of each GPU's memory its replicas take together, split evenly "
                             "between the replicas placed on it (default 0.9)")
    parser.add_argument("--dtype", default="auto", choices=("auto", *DTYPE_NAMES),
                        help="the replicas' dtype (default auto: on a CPU, bfloat16 where it has AVX512-BF16 "
                             "or AMX, else float32; on a GPU, the checkpoint's, bfloat16 for a float32 one)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="the replicas run every step through the model's modules (default: on a CPU, decode "
                             "steps as a plan of compiled calls bound once, with the same results)")
    parser.add_argument("--quantized-weights", choices=QUANTIZED_WEIGHTS, default="dequantized",
                        help="the replicas': widen every weight to --dtype at load, or multiply the matrices a "
                             ".gguf holds in Q8_0, Q4_0 or Q4_1 blocks as stored: under half the memory and, on a "
                             "CPU, faster steps of a few sequences, slower ones of many; as-stored-int8-activations: "
                             "as stored, and on a CPU a decode step's activations quantized to int8 per 32 for the "
                             "Q4 matrices, as llama.cpp does (faster again, not the dequantized weights' numerics); "
                             "as-stored-int8-prefill: a prefill's too, where faster (AVX512-VNNI without AMX; "
                             "further from those numerics) (default dequantized)")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                        help="the replicas': quantize the Linear layers' weights at load, in groups of 32, to int8 "
                             "(Q8_0) or int4 (Q4_1; the head Q8_0), served by the block kernels; or w8a8: q/k/v "
                             "and gate/up as int8 weights per output row times int8 activations per token, "
                             "smoothed at load, the rest in --dtype (default: none); with --quantized-weights "
                             "as-stored, the layers a .gguf holds in blocks keep them")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="the replicas' KV pools: auto (in --dtype) or int8 (each token's K and V per kv head as "
                             "int8 levels and a float32 scale: about half of bfloat16's bytes, so twice the tokens)")
    parser.add_argument("--kv-cache-memory", type=_memory_size, metavar="SIZE",
                        help="each replica's KV pool, e.g. 4GiB, 512MiB or a number of bytes (default on a "
                             "CPU: half of the memory available, split evenly between the replicas and held to "
                             "the room in /dev/shm; on CUDA see --gpu-memory-utilization)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="the replicas reuse the KV of prompt prefixes they have seen (default on)")
    parser.add_argument("--lend-idle-cpus", action=argparse.BooleanOptionalAction, default=True,
                        help="on CPU: prefill replica i lends its CPUs to decode replica i while it has no work, "
                             "taking them back before its next step (default on)")
    parser.add_argument("--routing", choices=ROUTING_POLICIES, default="cache-aware",
                        help="the gateway's: weigh the prompt tokens a replica holds cached against its "
                             "load, or load alone (default cache-aware)")
    parser.add_argument("--migration-limit", type=int, default=3,
                        help="the gateway's: times a request may move off replicas that went away (default 3)")
    parser.add_argument("--prefill-placement", choices=PLACEMENTS, default="auto",
                        help="the gateway's: where prompts are prefilled, on a prefill replica or the decode "
                             "replica itself, whichever is expected sooner (auto), or always on one (remote, local)")
    parser.add_argument("--max-step-ms", type=float, default=DEFAULT_MAX_STEP_MS,
                        help="the decode replicas': prompts they prefill go in chunks sized so that a step lasts "
                             f"at most this (default {DEFAULT_MAX_STEP_MS:g})")
    parser.add_argument("--line-order", choices=ORDERS, default="slo",
                        help="the gateway's: the order of prompts waiting for prefill, those that can still meet "
                             "the TTFT target first (slo), or arrival order (fifo)")
    parser.add_argument("--tool-call-parser", choices=sorted(TOOL_CALL_PARSERS), default=DEFAULT_TOOL_CALL_PARSER,
                        help="the gateway's: how the model writes tool calls, which chat answers are held to and "
                             f"read in (default {DEFAULT_TOOL_CALL_PARSER})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the gateway binds (default 127.0.0.1)")
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GATEWAY_GRPC_PORT,
                        help=f"gateway gRPC port (default {DEFAULT_GATEWAY_GRPC_PORT})")
    parser.add_argument("--http-port", type=int, default=DEFAULT_GATEWAY_HTTP_PORT,
                        help=f"gateway HTTP port (default {DEFAULT_GATEWAY_HTTP_PORT})")
    parser.add_argument("--api-key", action="append", metavar="KEY",
                        help="a key the gateway requires as 'Authorization: Bearer KEY'; repeat for more callers")
    parser.add_argument("--internal-tls", action=argparse.BooleanOptionalAction, default=True,
                        help="mutual TLS between the processes, with a CA and certificates made for this run and "
                             "deleted with it (default on; --no-internal-tls, plaintext, is for debugging)")
    parser.add_argument("--startup-timeout-s", type=float, default=120.0,
                        help="deadline for every process to become healthy (default 120)")
    parser.add_argument("--shutdown-timeout-s", type=float, default=15.0,
                        help="grace after SIGTERM before SIGKILL (default 15)")
    parser.set_defaults(run=run_up)


def run_compose_gpus(args: argparse.Namespace) -> int:
    from pdserve.compose_gpus import render

    sys.stdout.write(render(args.compose_file, args.prefill_gpus, args.decode_gpus))
    return 0


def add_compose_gpus(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compose-gpus", help="print compose.yaml with one prefill or decode service per GPU",
        description="Prints a Compose file (JSON) that runs compose.yaml's prefill and decode "
                    "services once per listed host GPU; every replica reserves all listed GPUs "
                    "and runs on its own. Use it as `docker compose -f FILE up`.")
    parser.add_argument("--prefill-gpus", type=_index_list, required=True, metavar="LIST",
                        help="host GPUs with a prefill replica each, e.g. 0")
    parser.add_argument("--decode-gpus", type=_index_list, required=True, metavar="LIST",
                        help="host GPUs with a decode replica each, e.g. 1,2,3")
    parser.add_argument("--compose-file", type=Path, default=Path("compose.yaml"),
                        help="the Compose file to rewrite (default ./compose.yaml)")
    parser.set_defaults(run=run_compose_gpus)


def run_generate(args: argparse.Namespace) -> int:
    import grpc

    from pdserve.generate_client import build_request, stream_generate

    request = build_request(
        args.prompt, chat=args.chat, max_tokens=args.max_tokens, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop=args.stop)

    num_chars_printed = 0

    def print_chunk(chunk) -> None:
        nonlocal num_chars_printed
        if args.token_ids:
            piece = "".join(f"{token_id} " for token_id in chunk.token_ids)
        else:
            piece = chunk.text
        sys.stdout.write(piece)
        sys.stdout.flush()
        num_chars_printed += len(piece)

    try:
        stats = stream_generate(args.gateway, request, args.timeout_s, print_chunk)
    except grpc.RpcError as error:
        if num_chars_printed:
            print()
        print(f"pdserve generate: {args.gateway}: {error.code().name}: {error.details()}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print()
        return 130
    print()
    print(stats.summary(), file=sys.stderr)
    return 0


def add_generate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate", help="stream one completion from a running gateway",
        description="Sends one request to a gateway's gRPC API and prints the text as it "
                    "streams, then a stats line (tokens, time to first token, tokens/s) "
                    "to stderr.")
    parser.add_argument("prompt")
    parser.add_argument("--gateway", default=f"127.0.0.1:{DEFAULT_GATEWAY_GRPC_PORT}",
                        metavar="HOST:PORT",
                        help=f"gateway gRPC address (default 127.0.0.1:{DEFAULT_GATEWAY_GRPC_PORT})")
    parser.add_argument("--max-tokens", type=_positive_int, default=64, help="default 64")
    parser.add_argument("--temperature", type=float, default=0.0, help="default 0 (greedy)")
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=_positive_int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="stop string (repeatable)")
    parser.add_argument("--chat", action="store_true",
                        help="send the prompt as a user chat message (model's chat template)")
    parser.add_argument("--token-ids", action="store_true",
                        help="print the generated token ids instead of the text")
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="deadline of the whole request (default 300)")
    parser.set_defaults(run=run_generate)


def run_healthcheck(args: argparse.Namespace) -> int:
    from pdserve.cluster.health_probe import probe
    from pdserve.cluster.internal_tls import internal_tls_from
    from pdserve.protocol.errors import InvalidConfigError

    try:
        tls = internal_tls_from(args)
    except InvalidConfigError as error:
        print(f"pdserve healthcheck: {error}", file=sys.stderr)
        return 1
    result = probe(args.target, args.timeout_s, tls)
    print(f"{args.target}: {result.detail}")
    return 0 if result.ready else 1


def add_healthcheck(subparsers: argparse._SubParsersAction) -> None:
    def declare_tls_arguments(parser: argparse.ArgumentParser) -> None:
        from pdserve.cluster.internal_tls import add_internal_tls_arguments

        add_internal_tls_arguments(parser)

    parser = subparsers.add_parser(
        "healthcheck", help="exit 0 if a server is healthy (for container healthchecks)",
        description="HOST:PORT asks the standard gRPC health service (grpc.health.v1) whether "
                    "the server is SERVING, over mutual TLS where the internal TLS flags (or their "
                    "variables, as a service in the same container reads them) are given; an "
                    "http:// URL must answer 200.", declare_arguments=declare_tls_arguments)
    parser.add_argument("target", metavar="HOST:PORT|URL")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="default 5")
    parser.set_defaults(run=run_healthcheck)


def run_certs(args: argparse.Namespace) -> int:
    from pdserve.cluster.certificates import write_certificates

    if args.days <= 0:
        print(f"pdserve certs: --days must be positive, not {args.days:g}", file=sys.stderr)
        return 1
    try:
        files = write_certificates(args.out, args.names, args.hosts, args.days)
    except FileExistsError as error:
        print(f"pdserve certs: {error.filename} exists; write a new set into an empty folder", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"pdserve certs: {error}", file=sys.stderr)
        return 1
    print(f"CA: {next(iter(files.values())).ca_path}")
    for name, paths in files.items():
        print(f"{name}: {paths.cert_path} {paths.key_path}")
    return 0


def add_certs(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "certs", help="make a CA and a certificate per service, for mutual TLS between them",
        description="Writes a new CA's certificate (ca.pem) and, for each of --names, a certificate "
                    "NAME.pem issued by it and its key NAME-key.pem, into --out (made, mode 0700; keys "
                    "0600). Each certificate names every one of --hosts: the hosts callers dial the "
                    f"replicas by, or, by default, the one name {CERT_SHARED_HOST!r}, for replicas whose "
                    "addresses are not known yet (pod IPs, container hostnames): then give every service "
                    f"--internal-tls-server-name {CERT_SHARED_HOST}. The CA's key is not kept: to add a "
                    "service, make a new set and give it to every service. Pass the files with "
                    "--internal-tls-ca, --internal-tls-cert and --internal-tls-key.")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the files go")
    parser.add_argument("--names", nargs="+", default=list(CERT_NAMES), metavar="NAME",
                        help=f"one certificate for each (default: {' '.join(CERT_NAMES)})")
    parser.add_argument("--hosts", nargs="+", default=[CERT_SHARED_HOST], metavar="HOST",
                        help=f"DNS names and IP addresses each certificate names (default: {CERT_SHARED_HOST})")
    parser.add_argument("--days", type=float, default=365.0, help="how long they are valid (default 365)")
    parser.set_defaults(run=run_certs)


def _add_service(subparsers: argparse._SubParsersAction, name: str, module: str, help: str) -> None:
    """A subcommand whose flags and body live in `module` (`add_arguments`, `run`), imported only
    when this subcommand is the one being parsed."""
    def declare_arguments(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module).add_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module).run(args)

    parser = subparsers.add_parser(name, help=help, declare_arguments=declare_arguments)
    parser.set_defaults(run=run, service=module)


def add_prefill(subparsers: argparse._SubParsersAction) -> None:
    _add_service(subparsers, "prefill", "pdserve.prefill_svc.main",
                 "serve a prefill replica (prompt batches, KV push to decode)")


def add_decode(subparsers: argparse._SubParsersAction) -> None:
    _add_service(subparsers, "decode", "pdserve.decode_svc.main", "serve a decode replica (paged KV pool, continuous batching)")


def add_gateway(subparsers: argparse._SubParsersAction) -> None:
    _add_service(subparsers, "gateway", "pdserve.gateway.disaggregated.main",
                 "serve the gateway (gRPC API and OpenAI-compatible HTTP API)")


def add_serve(subparsers: argparse._SubParsersAction) -> None:
    _add_service(subparsers, "serve", "pdserve.gateway.colocated.main",
                 "serve one colocated engine (prefill and decode in one batch) behind the OpenAI HTTP API")


def add_bench(subparsers: argparse._SubParsersAction) -> None:
    _add_service(subparsers, "bench", "pdserve.bench.cli",
                 "benchmarks: `pdserve bench WORKLOAD` (goodput, serve, offline, micro-benchmarks, report)")


def add_plan(subparsers: argparse._SubParsersAction) -> None:
    _add_service(subparsers, "plan", "pdserve.planner.cli",
                 "capacity planning: profile the model here, simulate xPyD configurations, recommend the P:D ratio")


def _index_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated device indexes, got {text!r}") from None


def _memory_size(text: str) -> int:
    from pdserve.engine.engine_config import memory_size_arg  # torch-free, imported when the flag is given

    return memory_size_arg(text)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


SUBCOMMANDS = (add_up, add_model, add_compose_gpus, add_gateway, add_prefill, add_decode, add_serve, add_generate, add_healthcheck,
               add_certs, add_bench, add_plan, add_make_tiny_model)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdserve", description="LLM serving with prefill/decode disaggregation.")
    subparsers = parser.add_subparsers(metavar="COMMAND", required=True,
                                       parser_class=_LazyArgumentParser)
    for add_subcommand in SUBCOMMANDS:
        add_subcommand(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except CheckpointError as error:
        print(f"pdserve: {error}", file=sys.stderr)
        return 2
