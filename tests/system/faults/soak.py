"""A chaos soak: Poisson load through `pdserve up` while one fault strikes every `every_s`.

    python -m tests.system.faults.soak --model MODEL --minutes 30 --every-s 30 --seed 1

starts `pdserve up --prefill 2 --decode 2` (the flags after `--` go to it too), takes the
unharmed greedy answer of every prompt of the pool, then for the soak's length sends greedy
requests as a Poisson process and, every `every_s`, one fault drawn with the seed:

    kill      SIGKILL of a replica (`up` starts it again)
    stop      SIGSTOP of a replica for 2-8 s, then SIGCONT
    redis     SIGKILL of Redis (`up` starts it again, from its last snapshot)

Partitions need processes on hosts of their own (tests/system/faults/test_partitions.py); `up`
runs every process on one loopback, so the soak leaves them out.

The report (JSON on stdout) counts requests sent, answered and failed (with their status codes),
lost (no answer nor error within the stream deadline), answers that differ from the unharmed
one, KV blocks still held once the load has stopped and settled, and records of the soak's
requests left in a state that is not terminal. A sound deployment loses none, leaks none, leaves
none stuck and changes no answer; a request that arrives while Redis is down fails with a clear
UNAVAILABLE, which is counted, not lost.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import redis
import torch

from pdserve.engine.config import ModelConfig
from pdserve.v1 import gateway_pb2_grpc
from tests.system.faults.conftest import greedy_request
from tests.system.faults.up_deployment import Up, start_up, stop_up

FAULTS = ("kill", "stop", "redis")
STREAM_TIMEOUT_S = 180.0
SETTLE_TIMEOUT_S = 90.0  # after the load, for blocks to come back and records to end
NUM_PROMPTS = 16
TERMINAL = {"FINISHED", "ABORTED", "FAILED"}


@dataclass(frozen=True, slots=True)
class SoakConfig:
    seconds: float
    every_s: float
    rate_per_s: float
    seed: int
    max_tokens: int = 32


@dataclass
class SoakReport:
    sent: int = 0
    answered: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # status code -> requests
    lost: int = 0
    differing: int = 0
    leaked_blocks: int = 0
    stuck_records: int = 0
    faults: list[str] = field(default_factory=list)  # "t+12.0s stop decode-1", ...

    @property
    def sound(self) -> bool:
        return not (self.lost or self.differing or self.leaked_blocks or self.stuck_records)


def pool_of_prompts(model_dir: str, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    vocab_size = ModelConfig.from_dir(model_dir).vocab_size
    return [torch.randint(0, vocab_size, (int(n),), generator=generator).tolist()
            for n in torch.randint(16, 200, (NUM_PROMPTS,), generator=generator)]


async def stream(endpoint: str, request) -> tuple[list[int], str]:
    """The request's tokens, and "" or the status code it ended with ("LOST": no end by the deadline)."""
    tokens, started_s = [], time.monotonic()
    try:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            async for chunk in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=STREAM_TIMEOUT_S):
                tokens += chunk.token_ids
    except grpc.aio.AioRpcError as exc:
        lost = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started_s >= STREAM_TIMEOUT_S
        return tokens, "LOST" if lost else exc.code().name
    return tokens, ""


async def unharmed_answers(up: Up, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    answers = await asyncio.gather(*(stream(up.gateway, greedy_request(f"unharmed-{i}", prompt, max_tokens))
                                     for i, prompt in enumerate(prompts)))
    if any(error for _, error in answers):
        raise RuntimeError(f"the unharmed run failed: {[error for _, error in answers]}")
    return [tokens for tokens, _ in answers]


class Chaos:
    """Draws and injects the faults; keeps every process it stopped so it can resume them."""

    def __init__(self, up: Up, rng: random.Random, started_s: float):
        self.up = up
        self.rng = rng
        self.started_s = started_s
        self.stopped: set[int] = set()
        self.log: list[str] = []

    async def strike(self) -> None:
        fault = self.rng.choice(FAULTS)
        children = self.up.children()
        replicas = sorted(name for name in children if name.startswith(("prefill-", "decode-")))
        target = "redis-server" if fault == "redis" else self.rng.choice(replicas)
        pid = children.get(target)
        self.log.append(f"t+{time.monotonic() - self.started_s:.1f}s {fault} {target}")
        if pid is None:  # down already, being restarted
            return
        if fault == "stop":
            os.kill(pid, signal.SIGSTOP)
            self.stopped.add(pid)
            await asyncio.sleep(self.rng.uniform(2.0, 8.0))
            self.resume(pid)
        else:
            os.kill(pid, signal.SIGKILL)

    def resume(self, pid: int) -> None:
        if pid in self.stopped:
            self.stopped.discard(pid)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def resume_all(self) -> None:
        for pid in list(self.stopped):
            self.resume(pid)


async def run_soak(up: Up, model_dir: str, config: SoakConfig) -> SoakReport:
    rng = random.Random(config.seed)
    prompts = pool_of_prompts(model_dir, config.seed)
    answers = await unharmed_answers(up, prompts, config.max_tokens)
    report = SoakReport()
    started_s = time.monotonic()
    chaos = Chaos(up, rng, started_s)
    outcomes: list[tuple[int, list[int], str]] = []

    async def one(index: int, case: int) -> None:
        tokens, error = await stream(up.gateway, greedy_request(f"soak-{index}", prompts[case], config.max_tokens))
        outcomes.append((case, tokens, error))

    async def faults() -> None:
        while time.monotonic() - started_s + config.every_s <= config.seconds:
            await asyncio.sleep(config.every_s)
            await chaos.strike()

    fault_task = asyncio.create_task(faults())
    requests = []
    try:
        while time.monotonic() - started_s < config.seconds:
            requests.append(asyncio.create_task(one(len(requests), rng.randrange(len(prompts)))))
            await asyncio.sleep(rng.expovariate(config.rate_per_s))
        await fault_task
        await asyncio.gather(*requests)
    finally:
        fault_task.cancel()
        chaos.resume_all()

    report.sent, report.faults = len(outcomes), chaos.log
    codes = Counter(error for _, _, error in outcomes if error)
    report.lost = codes.pop("LOST", 0)
    report.failed = dict(codes)
    report.answered = sum(not error for _, _, error in outcomes)
    report.differing = sum(tokens != answers[case] for case, tokens, error in outcomes if not error)
    report.leaked_blocks, report.stuck_records = await asyncio.to_thread(settle, up, report.sent)
    return report


def settle(up: Up, num_sent: int) -> tuple[int, int]:
    """Blocks still held on every replica, and records of soak-* requests not terminal, once
    both are as good as they get within SETTLE_TIMEOUT_S."""
    deadline_s = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        held, stuck = blocks_held(up), stuck_records(up, num_sent)
        if (held == 0 and stuck == 0) or time.monotonic() > deadline_s:
            return held, stuck
        time.sleep(1.0)


def blocks_held(up: Up) -> int:
    try:
        entries = [*up.registry("decode").values(), *up.registry("prefill").values()]
    except redis.RedisError:
        return -1
    return sum(entry["total_blocks"] - entry["free_blocks"] for entry in entries) if entries else -1


def stuck_records(up: Up, num_sent: int) -> int:
    client = redis.Redis.from_url(up.redis_url, decode_responses=True, socket_timeout=5)
    try:
        states = [client.hget(f"req:soak-{index}", "state") for index in range(num_sent)]
    except redis.RedisError:
        return -1
    finally:
        client.close()
    return sum(state is not None and state not in TERMINAL for state in states)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("up_flags", nargs="*", help="after --: more flags for `pdserve up`")
    args = parser.parse_args(argv)
    config = SoakConfig(args.minutes * 60, args.every_s, args.rate, args.seed, args.max_tokens)
    with tempfile.TemporaryDirectory() as work_dir:
        up = start_up(Path(work_dir), args.model, "--prefill", "2", "--decode", "2", *args.up_flags)
        try:
            report = asyncio.run(run_soak(up, args.model, config))
        finally:
            stop_up(up)
    print(json.dumps(asdict(report) | {"sound": report.sound}, indent=2))
    return 0 if report.sound else 1


if __name__ == "__main__":
    sys.exit(main())
