"""A replica's waiting queue takes a prompt while fewer than `--max-waiting-requests` wait, and
refuses it (RESOURCE_EXHAUSTED) once that many do; the flag is at least 1."""
import argparse

import grpc
import pytest

from pdserve.cluster.grpc_errors import status_for
from pdserve.cluster.service_args import add_replica_arguments
from pdserve.cluster.waiting_bound import DEFAULT_MAX_WAITING_REQUESTS, WaitingQueueFullError, check_waiting_room


def test_a_prompt_joins_while_fewer_than_the_bound_wait_and_is_refused_at_it():
    check_waiting_room(0, 1)
    check_waiting_room(2, 3)
    for num_waiting in (3, 4):
        with pytest.raises(WaitingQueueFullError) as refused:
            check_waiting_room(num_waiting, 3)
        assert status_for(refused.value)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-waiting-requests" in str(refused.value)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_replica_arguments(parser, "prefill")
    return parser.parse_args(["--redis-url", "redis://localhost:6379/0", *argv])


def test_the_bound_is_a_replica_flag_of_at_least_one():
    assert parse().max_waiting_requests == DEFAULT_MAX_WAITING_REQUESTS
    assert parse("--max-waiting-requests", "8").max_waiting_requests == 8
    with pytest.raises(argparse.ArgumentError):
        parse("--max-waiting-requests", "0")
