"""`pdserve up` runs internal gRPC on mutual TLS unless --no-internal-tls: every child gets a
certificate of its own from one CA made for the run, for loopback, in its environment (never on
argv), and loads it as its service would; up probes the replicas with a certificate of its own and
the gateway's public front in plaintext; children inherit no TLS settings from up's environment.
`pdserve certs` writes a set for a deployment, and `pdserve healthcheck` reads the variables."""
import argparse
import os

import pytest
from cryptography import x509

from pdserve import cli
from pdserve.checkpoints.model_ref import ResolvedModel
from pdserve.cluster.internal_tls import CA_ENV, CERT_ENV, KEY_ENV, SERVER_NAME_ENV, TLS_ENV_VARS, internal_tls_from
from pdserve.up import PROBER, UpConfig, child_slots, internal_certificates


def up_config(tmp_path, *flags: str) -> UpConfig:
    args = cli.build_parser().parse_args(["up", *flags])
    return UpConfig(
        model=str(tmp_path), num_prefill=args.prefill, num_decode=args.decode, redis_url=None,
        transport=args.transport, device="cpu", dtype=args.dtype, host=args.host, grpc_port=args.grpc_port,
        http_port=args.http_port, startup_timeout_s=1.0, shutdown_timeout_s=1.0, internal_tls=args.internal_tls)


def child_args(spec, monkeypatch) -> argparse.Namespace:
    """The child's command line as its service parses it, in the child's environment."""
    with monkeypatch.context() as patch:
        for name in TLS_ENV_VARS:
            patch.delenv(name, raising=False)
        for name, value in spec.env.items():
            patch.setenv(name, value)
        return cli.build_parser().parse_args(spec.argv[3:])  # after `python -m pdserve`


def test_internal_tls_is_on_unless_turned_off():
    assert cli.build_parser().parse_args(["up"]).internal_tls
    assert not cli.build_parser().parse_args(["up", "--no-internal-tls"]).internal_tls


def test_every_child_gets_its_own_certificate_from_one_ca_in_its_environment(tmp_path, monkeypatch):
    config = up_config(tmp_path, "--decode", "2")
    tls = internal_certificates(tmp_path / "tls", config)
    assert oct((tmp_path / "tls").stat().st_mode & 0o777) == "0o700"
    specs = {slot.name: slot.make_spec()
             for slot in child_slots(config, ResolvedModel(tmp_path, "m"), "redis://x", "s3cret", tls)}
    assert sorted(specs) == ["decode-0", "decode-1", "gateway", "prefill-0"]
    loaded = {name: internal_tls_from(child_args(spec, monkeypatch)) for name, spec in specs.items()}
    assert len({tls.ca_pem for tls in loaded.values()}) == 1
    assert len({tls.key_pem for tls in loaded.values()}) == len(specs)  # one key per process
    for name, spec in specs.items():
        assert spec.env[CERT_ENV] == str(tls[name].cert_path)
        assert not any(path in arg for arg in spec.argv for path in (spec.env[CA_ENV], spec.env[KEY_ENV]))
        cert = x509.load_pem_x509_certificate(loaded[name].cert_pem)
        assert "127.0.0.1" in [str(ip) for ip in cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)]
    prober = tls[PROBER].load()
    for name in ("prefill-0", "decode-0", "decode-1"):
        assert specs[name].grpc_tls == prober  # up's own certificate, none of its children's
    assert specs["gateway"].grpc_tls is None  # its public front is plaintext


def test_children_inherit_no_tls_settings_from_ups_environment(tmp_path, monkeypatch):
    for name in TLS_ENV_VARS:
        monkeypatch.setenv(name, f"/elsewhere/{name}")
    config = up_config(tmp_path)
    with_tls = child_slots(config, ResolvedModel(tmp_path, "m"), "redis://x", "s",
                           internal_certificates(tmp_path / "tls", config))
    without = child_slots(config, ResolvedModel(tmp_path, "m"), "redis://x", "s")
    for slot in with_tls:
        env = slot.make_spec().env
        assert SERVER_NAME_ENV not in env and env[CA_ENV].startswith(str(tmp_path)), slot.name
    for slot in without:
        spec = slot.make_spec()
        assert not set(TLS_ENV_VARS) & set(spec.env) and spec.grpc_tls is None, slot.name


def test_pdserve_certs_writes_a_set_that_services_load(tmp_path, monkeypatch, capsys):
    out = tmp_path / "certs"
    assert cli.main(["certs", "--out", str(out), "--hosts", "10.0.0.5", "pdserve-internal"]) == 0
    assert sorted(os.listdir(out)) == ["ca.pem", "decode-key.pem", "decode.pem", "gateway-key.pem", "gateway.pem",
                                       "prefill-key.pem", "prefill.pem"]
    assert str(out / "ca.pem") in capsys.readouterr().out
    for name, value in ((CA_ENV, "ca.pem"), (CERT_ENV, "decode.pem"), (KEY_ENV, "decode-key.pem")):
        monkeypatch.setenv(name, str(out / value))
    monkeypatch.setenv(SERVER_NAME_ENV, "pdserve-internal")
    args = cli.build_parser().parse_args(["healthcheck", "127.0.0.1:50061"])
    assert internal_tls_from(args).server_name == "pdserve-internal"
    assert cli.main(["certs", "--out", str(out)]) == 1  # never over an existing set
    assert cli.main(["certs", "--out", str(tmp_path / "expired"), "--days", "0"]) == 1
    assert not (tmp_path / "expired").exists()


@pytest.mark.parametrize("command", [["certs", "--help"], ["healthcheck", "--help"]])
def test_certs_and_healthcheck_document_the_shared_name(command, capsys):
    with pytest.raises(SystemExit):
        cli.main(command)
    assert "server-name" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")
