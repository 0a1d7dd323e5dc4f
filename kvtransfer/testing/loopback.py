"""A decode-side KV endpoint in a process of its own, for end-to-end checks and benchmarks.

The child process owns a KV pool (shared CPU memory, or CUDA) and its write fence, serves
`KVTransfer` through a real `KVReceiver` on a loopback port (or `host`, in the network namespace
`netns` names, to be reached from another one), and keeps a plain reservation table (each
reservation with its write token, which a write must present). The parent drives it through a
pipe, each call with a deadline:

    reserve(request id, block ids, transport) -> KVTarget, as a decode replica would return it
    release(request id)   the reservation ends (as when it expires); False while an in-place
                          writer holds its write fence, which then stays open
    landed()              request id -> bytes, for the requests whose KV has landed
    pool()                a copy of the child's whole pool, read by the child itself
"""
from __future__ import annotations

import asyncio
import ctypes
import hmac
import multiprocessing
import secrets
import threading
import time
from dataclasses import dataclass

import grpc
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.receiver import KVReceiver
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.transports import create_kv_pool, target_fields
from pdserve.kvtransfer.write_fence import WriteFence
from pdserve.protocol.errors import NotFoundError, TransportUnavailableError, WriteTokenError
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES

_CLONE_NEWNET = 0x40000000  # from <sched.h>


@dataclass(frozen=True, slots=True)
class LoopbackConfig:
    spec: KVCacheSpec
    num_blocks: int
    device: str  # "cpu" gives a shared-memory pool
    model_name: str
    host: str = "127.0.0.1"
    call_timeout_s: float = 30.0
    netns: str = ""  # an `ip netns` name the child serves from; "" for this process's own


class LoopbackDecode:
    """The parent's handle on the child; a context manager that starts and stops it."""

    def __init__(self, config: LoopbackConfig):
        self.config = config
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_serve, args=(child_conn, config), daemon=True)
        self.endpoint = ""
        self.layout = make_layout(config.model_name, config.spec)

    def __enter__(self) -> LoopbackDecode:
        self._process.start()
        self.endpoint = self._receive(self.config.call_timeout_s * 2)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def reserve(self, request_id: str, block_ids: list[int], transport: int, ttl_s: float = 60.0) -> KVTarget:
        return self._call("reserve", request_id, block_ids, transport, ttl_s)

    def release(self, request_id: str) -> bool:
        return self._call("release", request_id)

    def landed(self) -> dict[str, int]:
        return self._call("landed")

    def pool(self) -> torch.Tensor:
        """[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim], a copy."""
        data = self._call("dump")
        tensor = torch.frombuffer(bytearray(data), dtype=self.config.spec.dtype)
        return tensor.view(self.config.spec.shape(self.config.num_blocks))

    def stop(self) -> None:
        if self._process.is_alive():
            try:
                self._call("stop")
            finally:
                self._process.join(self.config.call_timeout_s)
                if self._process.is_alive():
                    self._process.terminate()
                    self._process.join(self.config.call_timeout_s)
        self._conn.close()

    def _call(self, *command: object):
        self._conn.send(command)
        return self._receive(self.config.call_timeout_s)

    def _receive(self, timeout_s: float):
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the loopback decode process did not answer within {timeout_s} s")
        try:
            status, payload = self._conn.recv()
        except EOFError as error:
            raise RuntimeError("the loopback decode process exited") from error
        if status == "unavailable":
            raise TransportUnavailableError(payload)
        if status != "ok":
            raise RuntimeError(f"loopback decode process failed: {payload}")
        return payload


class _ReservationTable:
    def __init__(self):
        self._lock = threading.Lock()
        self._block_ids: dict[str, list[int]] = {}
        self._write_tokens: dict[str, bytes] = {}
        self._landed: dict[str, int] = {}

    def reserve(self, request_id: str, block_ids: list[int]) -> bytes:
        with self._lock:
            self._block_ids[request_id] = list(block_ids)
            self._write_tokens[request_id] = secrets.token_bytes(16)
            return self._write_tokens[request_id]

    def release(self, request_id: str) -> list[int]:
        with self._lock:
            return self._block_ids.pop(request_id, [])

    def landed(self) -> dict[str, int]:
        with self._lock:
            return dict(self._landed)

    def begin_write(self, request_id: str, write_token: bytes) -> list[int]:
        with self._lock:
            return self._writable(request_id, write_token)

    def end_write(self, request_id: str) -> None:
        pass

    def mark_landed(self, request_id: str, write_token: bytes, num_bytes: int) -> None:
        with self._lock:
            self._writable(request_id, write_token)
            self._landed[request_id] = num_bytes

    def _writable(self, request_id: str, write_token: bytes) -> list[int]:
        if request_id not in self._block_ids:
            raise NotFoundError(f"request {request_id} holds no KV reservation here")
        if not hmac.compare_digest(write_token, self._write_tokens[request_id]):
            raise WriteTokenError(f"request {request_id}: wrong write token")
        return self._block_ids[request_id]


def _serve(conn, config: LoopbackConfig) -> None:
    try:
        if config.netns:
            _enter_netns(config.netns)
        asyncio.run(_serve_async(conn, config))
    except BaseException as error:
        conn.send(("error", repr(error)))
        raise


def _enter_netns(name: str) -> None:
    """Moves this thread into network namespace `name`; the sockets it makes from then on (the
    server's listening one included) are in it. Python 3.12's os.setns, through libc."""
    with open(f"/run/netns/{name}") as namespace:
        if ctypes.CDLL(None, use_errno=True).setns(namespace.fileno(), _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter network namespace {name}")


async def _serve_async(conn, config: LoopbackConfig) -> None:
    pool = create_kv_pool(config.spec, config.num_blocks, config.device, shared=config.device == "cpu")
    fence = WriteFence(config.num_blocks)
    layout = make_layout(config.model_name, config.spec)
    table = _ReservationTable()
    # The limit of pdserve's own servers, which the largest chunk a sender makes fits.
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    KVReceiver(pool, layout, table).add_to_server(server)
    port = server.add_insecure_port(f"{config.host}:0")
    await server.start()
    endpoint = f"{config.host}:{port}"
    conn.send(("ok", endpoint))
    try:
        while True:
            try:
                command, *args = await asyncio.to_thread(conn.recv)
            except EOFError:  # the parent is gone
                return
            if command == "stop":
                conn.send(("ok", None))
                return
            if command == "reserve":
                request_id, block_ids, transport, ttl_s = args
                try:
                    fields = target_fields(pool, transport)
                except TransportUnavailableError as error:
                    conn.send(("unavailable", str(error)))
                    continue
                write_token = table.reserve(request_id, block_ids)
                target = KVTarget(
                    request_id=request_id, block_ids=tuple(block_ids), layout=layout, transport=transport,
                    decode_replica="loopback", kv_endpoint=endpoint, deadline_unix_s=time.time() + ttl_s,
                    write_token=write_token, fence_name=fence.name, fence_generation=fence.generation(block_ids[0]),
                    **fields,
                )
                conn.send(("ok", target))
            elif command == "release":
                released = table.release(*args)
                conn.send(("ok", not released or fence.try_close(released[0])))
            elif command == "landed":
                conn.send(("ok", table.landed()))
            elif command == "dump":
                conn.send(("ok", pool.tensor.cpu().contiguous().view(torch.uint8).numpy().tobytes()))
            else:
                conn.send(("error", f"unknown command {command!r}"))
    finally:
        await server.stop(grace=1.0)
        pool.close()
        fence.close()
