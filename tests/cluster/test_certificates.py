"""The deployment's CA and its certificates (`pdserve certs`, `pdserve up`): one CA signs a
certificate per process, good for serving and calling, naming its hosts (IP SANs for addresses),
with keys only their owner reads, in a folder only its owner enters; nothing is overwritten."""
import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from pdserve.cluster.certificates import CertificateAuthority, write_certificates


def load(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_each_name_gets_its_own_key_and_a_certificate_from_the_one_ca(tmp_path):
    files = write_certificates(tmp_path / "certs", ["gateway", "prefill", "decode"], ["10.0.0.7", "pdserve-internal"],
                               valid_days=30)
    assert sorted(files) == ["decode", "gateway", "prefill"]
    ca = load(files["gateway"].ca_path)
    assert {paths.ca_path for paths in files.values()} == {tmp_path / "certs" / "ca.pem"}
    assert len({paths.key_path.read_bytes() for paths in files.values()}) == 3
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for name, paths in files.items():
        cert = load(paths.cert_path)
        cert.verify_directly_issued_by(ca)
        assert cert.subject.rfc4514_string() == f"CN={name}"
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
        assert names.get_values_for_type(x509.DNSName) == ["pdserve-internal"]
        assert 29 < (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 30


def test_keys_are_private_to_their_owner_and_so_is_the_folder(tmp_path):
    files = write_certificates(tmp_path / "certs", ["decode"], ["127.0.0.1"], valid_days=1)
    assert mode(tmp_path / "certs") == 0o700
    assert mode(files["decode"].key_path) == 0o600
    assert mode(files["decode"].cert_path) & 0o022 == 0 and mode(files["decode"].ca_path) & 0o022 == 0


def test_an_existing_set_is_never_overwritten(tmp_path):
    first = write_certificates(tmp_path, ["decode"], ["127.0.0.1"], valid_days=1)
    before = first["decode"].key_path.read_bytes()
    with pytest.raises(FileExistsError):
        write_certificates(tmp_path, ["decode"], ["127.0.0.1"], valid_days=1)
    assert first["decode"].key_path.read_bytes() == before


@pytest.mark.parametrize("name", ["../escape", "ca", "", "a/b"])
def test_a_name_that_is_not_a_plain_file_name_is_refused_before_anything_is_written(tmp_path, name):
    with pytest.raises(ValueError):
        write_certificates(tmp_path / "certs", ["decode", name], ["127.0.0.1"], valid_days=1)
    assert not (tmp_path / "certs").exists()


def test_a_certificate_needs_a_host():
    with pytest.raises(ValueError, match="host"):
        CertificateAuthority("test CA", valid_days=1).issue("decode", [])
