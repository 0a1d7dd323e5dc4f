"""Transport choice as a specification: the fastest transport that can work, and a forced one
only where it can work (never a quiet fallback)."""
import pytest

from pdserve.protocol.transport_choice import choose_transport, validate_forced
from pdserve.protocol.errors import TransportUnavailableError
from pdserve.v1 import common_pb2

SHM, GRPC, CUDA_IPC = common_pb2.TRANSPORT_SHM, common_pb2.TRANSPORT_GRPC, common_pb2.TRANSPORT_CUDA_IPC


@pytest.mark.parametrize(
    "prefill_host, prefill_device, decode_host, decode_device, expected",
    [
        ("h1", "cuda:0", "h1", "cuda:1", CUDA_IPC),
        ("h1", "cpu", "h1", "cpu", SHM),
        ("h1", "cuda", "h1", "cpu", GRPC),
        ("h1", "cuda", "h2", "cuda", GRPC),
        ("h1", "cpu", "h2", "cpu", GRPC),
        ("", "cpu", "", "cpu", GRPC),  # unknown hosts are never the same host
    ],
)
def test_choice_from_hosts_and_devices(prefill_host, prefill_device, decode_host, decode_device, expected):
    assert choose_transport(prefill_host, prefill_device, decode_host, decode_device, None) == expected
    unspecified = common_pb2.TRANSPORT_UNSPECIFIED
    assert choose_transport(prefill_host, prefill_device, decode_host, decode_device, unspecified) == expected


def test_a_forced_transport_wins_where_it_can_work():
    assert choose_transport("h1", "cuda", "h1", "cuda", GRPC) == GRPC
    assert choose_transport("h1", "cpu", "h2", "cuda", GRPC) == GRPC
    assert choose_transport("h1", "cpu", "h1", "cpu", SHM) == SHM


@pytest.mark.parametrize(
    "forced, prefill_host, prefill_device, decode_host, decode_device, reason",
    [
        (SHM, "h1", "cpu", "h2", "cpu", "same host"),
        (CUDA_IPC, "h1", "cuda", "h2", "cuda", "same host"),
        (CUDA_IPC, "h1", "cpu", "h1", "cpu", "prefill KV pool on CUDA"),
        (CUDA_IPC, "h1", "cuda", "h1", "cpu", "decode KV pool on CUDA"),
        (SHM, "h1", "cuda:0", "h1", "cuda:0", "on CPU"),
        (7, "h1", "cpu", "h1", "cpu", "not a KV transport"),
    ],
)
def test_a_forced_transport_that_cannot_work_is_an_error(
    forced, prefill_host, prefill_device, decode_host, decode_device, reason
):
    with pytest.raises(TransportUnavailableError, match=reason):
        validate_forced(forced, prefill_host, prefill_device, decode_host, decode_device)
    with pytest.raises(TransportUnavailableError):
        choose_transport(prefill_host, prefill_device, decode_host, decode_device, forced)
