"""Hosts of their own on one machine, as far as the network stack and shared memory go.

    pdns-<id>-sw       switch namespace: bridge br0, one veth port per host below
    pdns-<id>-<name>   one namespace per host: lo, and eth0 at 10.213.<n>.<k>/24 on br0
    root namespace     this process: veth pdns-<id> at 10.213.<n>.1/24 on br0, so it reaches
                       every host (its only change to the root namespace)

A command runs on a host through `launcher(name)`: `ip netns exec` gives it the host's network
and a mount namespace of its own (slave to the root's, so nothing mounted in it shows outside),
where a fresh tmpfs is mounted on /dev/shm before the command starts. Two hosts then share the
kernel (its boot id) and nothing else: a POSIX shared-memory segment one creates does not exist
for the other, so a refusal of shm between them is the real one, not a flag.

`cut(a, b)` partitions two hosts: each drops what it would send the other (a blackhole route), so
their connections go silent, as over a failed link, while both still reach every other host;
`heal(a, b)` removes the two routes.

`close()` removes what `create_hosts` made, by name: the root end of the veth pairs, then the
namespaces (which take their veth ends along). Stop the processes started on the hosts first: a
namespace with a process left in it outlives its name.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess

_SUBNETS = [ipaddress.ip_network(f"10.213.{n}.0/24") for n in range(16, 240)]
_COMMAND_TIMEOUT_S = 10.0
_WITH_PRIVATE_SHM = 'mount -t tmpfs tmpfs /dev/shm && exec "$@"'


class NetnsUnavailableError(RuntimeError):
    """This machine will not let us make network namespaces or mount in them (not root, no `ip`)."""


def _ip(*args: str) -> str:
    """Runs `ip ARGS` and returns its output; raises CalledProcessError with its stderr."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


class Hosts:
    """Namespaces on one bridge; `address(name)` is where every other host reaches `name`."""

    def __init__(self, prefix: str, subnet: ipaddress.IPv4Network):
        self.prefix = prefix  # pdns-<id>: every name this makes starts with it
        self.subnet = subnet
        self._addresses: dict[str, str] = {}  # host name -> its address
        self._num_addresses = 0
        self._namespaces: list[str] = []
        self._root_link = ""

    def namespace(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def address(self, name: str) -> str:
        return self._addresses[name]

    def launcher(self, name: str) -> list[str]:
        """A command-line prefix that runs the rest on host `name`, with a private /dev/shm."""
        return ["ip", "netns", "exec", self.namespace(name), "sh", "-c", _WITH_PRIVATE_SHM, "sh"]

    def add_switch(self) -> None:
        switch = self._add_namespace("sw")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        _ip("link", "add", self.prefix, "type", "veth", "peer", "name", "v-root", "netns", switch)
        self._root_link = self.prefix
        _ip("-n", switch, "link", "set", "v-root", "master", "br0", "up")
        _ip("addr", "add", f"{self._take_address()}/{self.subnet.prefixlen}", "dev", self._root_link)
        _ip("link", "set", self._root_link, "up")

    def add_host(self, name: str) -> None:
        namespace, switch = self._add_namespace(name), self.namespace("sw")
        _ip("-n", switch, "link", "add", f"v-{name}", "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("-n", switch, "link", "set", f"v-{name}", "master", "br0", "up")
        self._addresses[name] = self._take_address()
        _ip("-n", namespace, "addr", "add", f"{self._addresses[name]}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")

    def cut(self, a: str, b: str) -> None:
        for source, destination in ((a, b), (b, a)):
            _ip("-n", self.namespace(source), "route", "add", "blackhole", f"{self.address(destination)}/32")

    def heal(self, a: str, b: str) -> None:
        for source, destination in ((a, b), (b, a)):
            _ip("-n", self.namespace(source), "route", "del", "blackhole", f"{self.address(destination)}/32")

    def close(self) -> None:
        """Removes everything, even past a removal that fails; then raises the first failure."""
        removals = [("link", "del", self._root_link)] if self._root_link else []
        removals += [("netns", "del", namespace) for namespace in reversed(self._namespaces)]
        self._root_link, self._namespaces = "", []
        failures = []
        for removal in removals:
            try:
                _ip(*removal)
            except subprocess.CalledProcessError as error:
                failures.append(error)
        if failures:
            raise failures[0]

    def _add_namespace(self, name: str) -> str:
        namespace = self.namespace(name)
        _ip("netns", "add", namespace)
        self._namespaces.append(namespace)
        return namespace

    def _take_address(self) -> str:
        self._num_addresses += 1
        return str(self.subnet[self._num_addresses])


def create_hosts(names: list[str]) -> Hosts:
    """A switch, this process on it, and a host per name; NetnsUnavailableError where the first
    namespace cannot be made or /dev/shm not mounted in it, before anything is left behind."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NetnsUnavailableError("network namespaces need root and iproute2's `ip`")
    hosts = Hosts(f"pdns-{secrets.token_hex(3)}", _free_subnet())
    try:
        _probe(hosts)
        for name in names:
            hosts.add_host(name)
    except BaseException:
        hosts.close()
        raise
    return hosts


def _free_subnet() -> ipaddress.IPv4Network:
    """A random one of _SUBNETS that no address or route of the root namespace overlaps."""
    taken = list(_networks(_ip("-4", "route", "show", "table", "all") + _ip("-4", "-o", "addr")))
    free = [subnet for subnet in _SUBNETS if not any(subnet.overlaps(other) for other in taken)]
    if not free:
        raise NetnsUnavailableError(f"every subnet from {_SUBNETS[0]} to {_SUBNETS[-1]} is in use here")
    return secrets.choice(free)


def _networks(text: str):
    """Every address or prefix in `ip` output."""
    for token in text.split():
        try:
            yield ipaddress.ip_network(token, strict=False)
        except ValueError:
            continue


def _probe(hosts: Hosts) -> None:
    """The switch, and a tmpfs mounted in it: refused where this machine does not allow it."""
    try:
        hosts.add_switch()
    except subprocess.CalledProcessError as error:
        raise NetnsUnavailableError(f"`{' '.join(error.cmd)}` failed: {error.stderr.strip()}") from error
    probe = subprocess.run([*hosts.launcher("sw"), "true"], capture_output=True, text=True,
                           timeout=_COMMAND_TIMEOUT_S, check=False)
    if probe.returncode != 0:
        raise NetnsUnavailableError(f"cannot mount a private /dev/shm in a namespace: {probe.stderr.strip()}")
