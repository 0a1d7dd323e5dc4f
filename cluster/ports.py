"""Picking a port for a process about to start on this machine.

The kernel picks a port that nothing listens on at the moment of asking; the caller binds it
soon after, so a race with another process is possible but rare on a loopback address.
"""
import socket


def free_port(host: str) -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
