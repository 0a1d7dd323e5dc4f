"""The test tiers, as pyproject.toml declares them, and the two rules that follow from them.

A tier is a marker of [tool.pytest.ini_options] whose description starts with "(tier)" (e2e,
faults, redis, packaging, deploy, real_model, gpu); that list is the one place tiers are named.

`pytest --fast` (`make test`) deselects every test that carries a tier marker: what is left is
the fast tier. `pytest --tiered` keeps only those: `make test-all` runs the fast tier over
several workers, then the tiers one test at a time, since their processes and timings would
contend. A test that starts `pdserve up|serve|prefill|decode|gateway` or a
redis-server / valkey-server without a tier marker would slip a process cluster into it, so this
plugin (registered by tests/conftest.py) fails such a test at the start, naming the command, in
every tier.

It sees what the pytest process itself starts through subprocess (asyncio's subprocesses
included), not what those children start in turn: a test that runs a script which launches
`pdserve up` itself still needs its marker set by hand.
"""
from __future__ import annotations

import os
import subprocess

import pytest

TIER_TAG = "(tier)"
SERVICE_COMMANDS = {"up", "serve", "prefill", "decode", "gateway"}
SERVER_EXECUTABLES = {"redis-server", "valkey-server"}

_running: pytest.Item | None = None  # the test whose set-up, call or teardown runs now


def tiers(config: pytest.Config) -> tuple[str, ...]:
    """The tier markers: those declared in pyproject.toml with a description starting "(tier)"."""
    declared = (line.partition(":") for line in config.getini("markers"))
    return tuple(name.strip() for name, _, description in declared if description.strip().startswith(TIER_TAG))


def starts_a_service(args) -> str | None:
    """The command line, when args start a pdserve service or a Redis server; else None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = [os.fsdecode(args)]
    else:
        argv = [os.fsdecode(arg) for arg in args]
    names = [os.path.basename(arg) for arg in argv]
    if SERVER_EXECUTABLES & set(names):  # anywhere: pdserve runs its servers behind a wrapper
        return " ".join(argv)
    for i, name in enumerate(names[:-1]):
        pdserve = name == "pdserve" and (i == 0 or argv[i - 1] == "-m")
        if pdserve and argv[i + 1] in SERVICE_COMMANDS:
            return " ".join(argv)
    return None


class _TierCheckedPopen(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
        item = _running
        if item is not None and not any(item.get_closest_marker(tier) for tier in tiers(item.config)):
            command = starts_a_service(args)
            if command is not None:
                pytest.fail(f"{item.nodeid} starts `{command}` but has none of the markers "
                            f"{', '.join(tiers(item.config))}: mark it (e2e when unsure), so that `make test` "
                            f"leaves it out", pytrace=False)
        super().__init__(args, *rest, **kwargs)


_POPEN = subprocess.Popen


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: deselect every test with a tier marker (pyproject.toml's markers)")
    parser.addoption("--tiered", action="store_true", help="the complement of --fast: only tests with a tier marker")


def pytest_configure(config):
    if not tiers(config):
        raise pytest.UsageError(f"no marker in pyproject.toml's [tool.pytest.ini_options] is a {TIER_TAG} marker")
    if config.getoption("fast") and config.getoption("tiered"):
        raise pytest.UsageError("--fast and --tiered exclude each other")
    subprocess.Popen = _TierCheckedPopen


def pytest_unconfigure(config):
    subprocess.Popen = _POPEN


def pytest_collection_modifyitems(config, items):
    fast, tiered = config.getoption("fast"), config.getoption("tiered")
    if not (fast or tiered):
        return
    tier_markers = tiers(config)
    kept, deselected = [], []
    for item in items:
        in_a_tier = any(item.get_closest_marker(tier) for tier in tier_markers)
        (kept if in_a_tier == tiered else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _running
    _running = item
    try:
        return (yield)
    finally:
        _running = None
