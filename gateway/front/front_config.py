"""What a public front (`pdserve gateway`, `pdserve serve`) is configured with beyond its model:
who may call it (API keys), whether it speaks TLS, how many requests it holds at once, the
largest request it takes (one limit for an HTTP body and a gRPC message), and how the model
writes tool calls (the OpenAI front's `--tool-call-parser`).

The flags are declared here once for both commands. A certificate and key are read when the
front starts, so a bad path or a key that does not match its certificate stops the start with
a clear error instead of failing the first client.
"""
from __future__ import annotations

import argparse
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from pdserve.gateway.front.admission import DEFAULT_MAX_PENDING_REQUESTS
from pdserve.gateway.front.api_keys import ENV_VAR, ApiKeys, api_keys_from
from pdserve.gateway.front.tool_parsers import DEFAULT_TOOL_CALL_PARSER, TOOL_CALL_PARSERS, ToolCallParser
from pdserve.protocol.errors import InvalidConfigError
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_path: Path  # PEM: the server's certificate, then any intermediates
    key_path: Path  # PEM: its private key

    def ssl_context(self) -> ssl.SSLContext:
        """For the HTTPS front."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert_path, self.key_path)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidConfigError(
                f"cannot load --tls-cert {self.cert_path} / --tls-key {self.key_path}: {exc}") from exc
        return context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """For the gRPC front; the files are checked as the HTTPS front would check them."""
        self.ssl_context()
        return grpc.ssl_server_credentials([(self.key_path.read_bytes(), self.cert_path.read_bytes())])


@dataclass(frozen=True, slots=True)
class FrontConfig:
    api_keys: ApiKeys
    tls: TlsFiles | None  # None: plaintext
    max_pending_requests: int
    max_request_bytes: int  # an HTTP body (413 past it) or a gRPC message (RESOURCE_EXHAUSTED)
    tool_call_parser: ToolCallParser


def add_front_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", action="append", metavar="KEY",
                        help=f"a key callers must send as 'Authorization: Bearer KEY'; repeat for more callers "
                             f"(also ${ENV_VAR}, comma-separated). None: the API is open")
    parser.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve over TLS with this certificate chain")
    parser.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--max-pending-requests", type=int, default=DEFAULT_MAX_PENDING_REQUESTS,
                        help="requests held at once; past it a request is refused with HTTP 429 / gRPC "
                             f"RESOURCE_EXHAUSTED (default {DEFAULT_MAX_PENDING_REQUESTS})")
    parser.add_argument("--max-request-bytes", type=int, default=MAX_MESSAGE_BYTES,
                        help="largest request taken: an HTTP body (413 past it) or a gRPC message (RESOURCE_EXHAUSTED) "
                             f"(default {MAX_MESSAGE_BYTES}, 64 MiB)")
    add_tool_call_parser_argument(parser)


def add_tool_call_parser_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tool-call-parser", choices=sorted(TOOL_CALL_PARSERS), default=DEFAULT_TOOL_CALL_PARSER,
                        help="how the model writes tool calls, which chat answers are held to and read in: hermes "
                             "(<tool_call>{...}</tool_call>), llama3_json ({\"name\", \"parameters\"}) or mistral "
                             f"([TOOL_CALLS][...]) (default {DEFAULT_TOOL_CALL_PARSER})")


def front_config_from(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> FrontConfig:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidConfigError("give both --tls-cert and --tls-key, or neither")
    tls = TlsFiles(args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    if tls is not None:
        tls.ssl_context()
    if args.max_request_bytes < 1:
        raise InvalidConfigError(f"--max-request-bytes must be at least 1, got {args.max_request_bytes}")
    return FrontConfig(api_keys_from(args.api_key, environ), tls, args.max_pending_requests, args.max_request_bytes,
                       TOOL_CALL_PARSERS[args.tool_call_parser])
