"""A burst of calls past gRPC core's own backlog (1,000 calls not yet taken up, by default) all
reach a GrpcServer's handlers: core drops none of them as CANCELLED (cluster/grpc_server.py)."""
import asyncio

import grpc

from pdserve.cluster.grpc_server import GrpcServer

NUM_CALLS = 2500  # arriving at once, faster than one event loop takes them up
METHOD = "/test.Echo/Call"


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


def test_a_burst_past_grpc_cores_default_backlog_reaches_the_handlers_whole():
    async def burst() -> list[bytes | str]:
        server = GrpcServer("127.0.0.1:0", [])
        server.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)})])
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                call = channel.unary_unary(METHOD)

                async def one(i: int) -> bytes | str:
                    try:
                        return await call(str(i).encode(), timeout=60)
                    except grpc.aio.AioRpcError as error:
                        return error.code().name

                return await asyncio.gather(*(one(i) for i in range(NUM_CALLS)))
        finally:
            await server.stop(0)

    answers = asyncio.run(burst())
    assert [a for a in answers if isinstance(a, str)] == []
    assert answers == [str(i).encode() for i in range(NUM_CALLS)]
