"""Which transport moves KV from a prefill replica to a decode replica (pure policy).

Same host and both pools on CUDA: CUDA_IPC. Same host and both on CPU: SHM. Anything else: GRPC.
A forced transport wins, but only if it can work: SHM and CUDA_IPC need the same host and pools
on CPU and CUDA respectively; asking for one where it cannot work is an error, not a fallback.
Devices are torch device strings ("cpu", "cuda", "cuda:1"); an empty host id is never "same".
"""
from pdserve.protocol.errors import TransportUnavailableError
from pdserve.v1 import common_pb2

TRANSPORT_NAMES = ("shm", "grpc", "cuda_ipc")
"""The transports by the names configuration uses (`--transport shm`)."""


def transport_name(transport: int) -> str:
    if transport in common_pb2.Transport.values():
        return common_pb2.Transport.Name(transport)
    return f"transport {transport}"


def transport_from_name(name: str) -> int | None:
    """`"shm"` -> TRANSPORT_SHM, ... for each of TRANSPORT_NAMES; "auto" -> None (chosen per request)."""
    if name == "auto":
        return None
    if name not in TRANSPORT_NAMES:
        raise TransportUnavailableError(f"unknown KV transport {name!r}, expected one of {TRANSPORT_NAMES}")
    return common_pb2.Transport.Value(f"TRANSPORT_{name.upper()}")


def choose_transport(
    prefill_host_id: str, prefill_device: str, decode_host_id: str, decode_device: str, forced: int | None
) -> int:
    if forced:
        validate_forced(forced, prefill_host_id, prefill_device, decode_host_id, decode_device)
        return forced
    if _same_host(prefill_host_id, decode_host_id):
        if _is_cuda(prefill_device) and _is_cuda(decode_device):
            return common_pb2.TRANSPORT_CUDA_IPC
        if not _is_cuda(prefill_device) and not _is_cuda(decode_device):
            return common_pb2.TRANSPORT_SHM
    return common_pb2.TRANSPORT_GRPC


def validate_forced(
    forced: int, prefill_host_id: str, prefill_device: str, decode_host_id: str, decode_device: str
) -> None:
    """Raises TransportUnavailableError if `forced` cannot work between these two replicas."""
    name = transport_name(forced)
    if forced == common_pb2.TRANSPORT_GRPC:
        return
    if forced not in (common_pb2.TRANSPORT_SHM, common_pb2.TRANSPORT_CUDA_IPC):
        raise TransportUnavailableError(f"{name} is not a KV transport")
    if not _same_host(prefill_host_id, decode_host_id):
        raise TransportUnavailableError(
            f"{name} needs prefill and decode on the same host, they are on "
            f"{prefill_host_id or 'an unknown host'} and {decode_host_id or 'an unknown host'}"
        )
    wants_cuda = forced == common_pb2.TRANSPORT_CUDA_IPC
    for role, device in (("prefill", prefill_device), ("decode", decode_device)):
        if _is_cuda(device) != wants_cuda:
            raise TransportUnavailableError(
                f"{name} needs the {role} KV pool on {'CUDA' if wants_cuda else 'CPU'}, it is on {device}"
            )


def _same_host(prefill_host_id: str, decode_host_id: str) -> bool:
    return bool(prefill_host_id) and prefill_host_id == decode_host_id


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda")
