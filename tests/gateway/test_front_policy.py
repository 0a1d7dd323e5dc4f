"""The front's pure policy: which Authorization values name a caller, how many requests the
admission bound lets in at once, and the configuration flags of the fronts."""
import argparse

import pytest
from prometheus_client import CollectorRegistry

from pdserve.protocol.errors import InvalidConfigError, InvalidRequestError
from pdserve.gateway.front.admission import Admission
from pdserve.gateway.front.frontend_types import OverloadedError
from pdserve.gateway.front.api_keys import ANONYMOUS, ApiKeys, UnauthenticatedError, api_keys_from
from pdserve.gateway.front.front_config import add_front_arguments, front_config_from


def test_no_key_configured_serves_everyone_as_one_anonymous_caller():
    keys = ApiKeys(())
    assert not keys.required
    assert keys.caller(None) == keys.caller("Bearer anything") == ANONYMOUS


def test_each_key_is_its_own_caller_known_by_a_fingerprint_that_is_not_the_key():
    keys = ApiKeys(["alpha-key", "beta-key"])
    alpha, beta = keys.caller("Bearer alpha-key"), keys.caller("bearer beta-key")
    assert alpha != beta and len(alpha) == len(beta) == 32
    assert "alpha-key" not in alpha and alpha == keys.caller("Bearer  alpha-key ")
    for refused in (None, "", "alpha-key", "Basic alpha-key", "Bearer alpha", "Bearer alpha-key2", "Bearer "):
        with pytest.raises(UnauthenticatedError):
            keys.caller(refused)


def test_keys_come_from_repeated_flags_and_the_comma_separated_environment():
    keys = api_keys_from(["flag-key"], {"PDSERVE_API_KEY": "env-1, env-2,"})
    callers = {keys.caller(f"Bearer {key}") for key in ("flag-key", "env-1", "env-2")}
    assert len(callers) == 3 and ANONYMOUS not in callers
    assert not api_keys_from(None, {}).required
    for bad in ([""], ["has,comma"], [" padded"]):
        with pytest.raises(InvalidConfigError):
            ApiKeys(bad)


def test_admission_refuses_past_its_bound_at_once_and_frees_each_slot_when_its_block_ends():
    admission = Admission(3, CollectorRegistry(), "m")
    with admission.admit(2, "http"):
        with pytest.raises(OverloadedError) as refused:
            admission.admit(2, "grpc")
        assert refused.value.retry_after_s >= 1
        with admission.admit(1, "grpc"):
            assert admission.num_pending == 3
            with pytest.raises(OverloadedError):
                admission.admit(1, "grpc")
    assert admission.num_pending == 0
    with pytest.raises(InvalidRequestError):  # more choices than the bound: no retry would help
        admission.admit(4, "http")
    with pytest.raises(RuntimeError):
        with admission.admit(3, "grpc"):
            raise RuntimeError("the stream failed")
    assert admission.num_pending == 0


def test_tls_needs_both_files_and_refuses_ones_it_cannot_load(tmp_path):
    parser = argparse.ArgumentParser()
    add_front_arguments(parser)
    with pytest.raises(InvalidConfigError):
        front_config_from(parser.parse_args(["--tls-cert", "cert.pem"]), {})
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(InvalidConfigError, match="cannot load"):
        front_config_from(parser.parse_args(["--tls-cert", str(tmp_path / "cert.pem"),
                                             "--tls-key", str(tmp_path / "missing.pem")]), {})
    assert front_config_from(parser.parse_args([]), {}).tls is None


def test_one_request_size_limit_for_both_fronts_64_mib_unless_given():
    parser = argparse.ArgumentParser()
    add_front_arguments(parser)
    assert front_config_from(parser.parse_args([]), {}).max_request_bytes == 64 * 2**20
    assert front_config_from(parser.parse_args(["--max-request-bytes", "4096"]), {}).max_request_bytes == 4096
    with pytest.raises(InvalidConfigError, match="--max-request-bytes"):
        front_config_from(parser.parse_args(["--max-request-bytes", "0"]), {})


def test_the_tool_call_parser_is_hermes_unless_given():
    parser = argparse.ArgumentParser()
    add_front_arguments(parser)
    assert front_config_from(parser.parse_args([]), {}).tool_call_parser.name == "hermes"
    assert front_config_from(parser.parse_args(["--tool-call-parser", "mistral"]), {}).tool_call_parser.name == "mistral"
    with pytest.raises(SystemExit):
        parser.parse_args(["--tool-call-parser", "qwen"])
