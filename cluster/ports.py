"""Picking a port for a process about to start on this machine.

The kernel picks a port that nothing listens on at the moment of asking; the caller binds it
soon after, so a race with another process is possible but rare on a loopback address. Ports
promised to a process that has not bound them yet (a gateway's configured ports) are nothing's
to the kernel: the caller names them in `reserved`, and they are never picked.
"""
import socket
from collections.abc import Collection

MAX_PICKS = 64


def free_port(host: str, reserved: Collection[int] = ()) -> int:
    """A port nothing listens on right now (the kernel's pick), not one of `reserved`."""
    for _ in range(MAX_PICKS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        if port not in reserved:
            return port
    raise OSError(f"no free port on {host} outside the {len(reserved)} reserved in {MAX_PICKS} picks")
