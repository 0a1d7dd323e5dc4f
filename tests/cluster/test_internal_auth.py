"""Where the deployment secret comes from: --internal-secret-file, else $PDSERVE_INTERNAL_SECRET,
never argv; an empty or unreadable file is a configuration error; no secret at all runs open
with one warning (and no internal TLS with one more)."""
import argparse
import logging

import pytest

from pdserve.cluster.internal_tls import TLS_ENV_VARS
from pdserve.cluster.service_args import add_internal_auth_arguments, internal_auth_from
from pdserve.protocol.errors import InvalidConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_internal_auth_arguments(parser)
    return parser.parse_args(argv)


def test_the_secret_comes_from_the_file_before_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_INTERNAL_SECRET", "from-env")
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-file\n")
    assert internal_auth_from(parse("--internal-secret-file", str(secret_file)), "decode").secret == b"from-file"
    auth = internal_auth_from(parse(), "gateway")
    assert auth.secret == b"from-env" and auth.caller_id.startswith("gateway-")
    assert len(auth.client_interceptors()) == 4 and len(auth.server_interceptors()) == 1


def test_an_empty_or_missing_secret_file_is_an_error(tmp_path):
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InvalidConfigError, match="empty"):
        internal_auth_from(parse("--internal-secret-file", str(tmp_path / "empty")), "decode")
    with pytest.raises(InvalidConfigError, match="--internal-secret-file"):
        internal_auth_from(parse("--internal-secret-file", str(tmp_path / "absent")), "decode")


def test_no_secret_runs_open_and_warns_once(monkeypatch, caplog):
    for name in ("PDSERVE_INTERNAL_SECRET", *TLS_ENV_VARS):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.WARNING):
        auth = internal_auth_from(parse(), "prefill")
    assert auth.secret is None and auth.server_interceptors() == []
    messages = [record.getMessage() for record in caplog.records]
    assert len([message for message in messages if "no internal secret" in message]) == 1
    assert len([message for message in messages if "no internal TLS" in message]) == 1  # see test_internal_tls
    assert len(messages) == 2

