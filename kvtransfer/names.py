"""The KV transports by the names configuration uses (`--transport shm`). Imports nothing, so a
command line can offer them without loading a transport; `choice.transport_from_name` maps them."""

TRANSPORT_NAMES = ("shm", "grpc", "cuda_ipc")
