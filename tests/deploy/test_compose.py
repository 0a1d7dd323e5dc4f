"""compose.yaml as a real Compose implementation reads it, and the facts deployments rely on:
GPU reservations, shared IPC/PID namespaces for CUDA IPC, healthchecks on every service,
scalable replicas that each advertise their own hostname, commands the CLI accepts, the
deployment secret and Redis password: required, in the environment, never on argv; and
internal mutual TLS: each service mounts the CA and its own certificate and key from the folder
`pdserve certs` writes, as Compose secrets, and loads them, healthchecks included.

Needs a Compose CLI: `docker-compose` (Debian package docker-compose) or `docker compose`.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from pdserve import cli
from pdserve.cluster.internal_tls import InternalTlsFiles

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "compose.yaml"
REPLICAS = ("prefill", "decode")
COMPOSE_VARIABLES = ("PDSERVE_MODEL_DIR", "PREFILL_GPU", "DECODE_GPU", "PREFILL_DEVICE",
                     "DECODE_DEVICE", "PDSERVE_TRANSPORT", "PDSERVE_GRPC_PORT", "PDSERVE_HTTP_PORT",
                     "PDSERVE_INTERNAL_SECRET", "PDSERVE_REDIS_PASSWORD", "PDSERVE_INTERNAL_TLS_DIR")
SECRETS = {"PDSERVE_INTERNAL_SECRET": "s3cret-of-the-deployment", "PDSERVE_REDIS_PASSWORD": "redis-pw"}


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return ["docker", "compose"]
    return None


COMPOSE = _compose_command()
pytestmark = [pytest.mark.deploy, pytest.mark.skipif(
    COMPOSE is None, reason="no Compose CLI (apt-get install docker-compose) to parse compose.yaml")]


def run_compose_config(variables: dict[str, str], compose_file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess:
    environ = {name: value for name, value in os.environ.items() if name not in COMPOSE_VARIABLES}
    return subprocess.run([*COMPOSE, "-f", str(compose_file), "--project-directory", str(REPO_ROOT), "config"],
                          cwd=REPO_ROOT,
                          env={**environ, **variables}, capture_output=True, text=True, timeout=60)


def compose_config(compose_file: Path = COMPOSE_FILE, **variables: str) -> dict:
    """`compose config`: the file validated, merged and interpolated with `variables` (and the
    required secrets)."""
    result = run_compose_config({**SECRETS, **variables}, compose_file)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def services() -> dict:
    return compose_config()["services"]


def container_argv(service: dict) -> list[str]:
    """The argv the container's process ends up with: the command, run through the entrypoint
    shell exactly as in the container (compose writes `$` as `$$` in its output)."""
    command = [str(part) for part in service["command"]]
    entrypoint = service.get("entrypoint")
    if entrypoint is None:
        return command
    assert entrypoint[:2] == ["/bin/sh", "-c"], entrypoint
    script, *script_args = [part.replace("$$", "$") for part in entrypoint[2:]]
    print_argv = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
    result = subprocess.run(["/bin/sh", "-c", script, *script_args, *print_argv, *command],
                            capture_output=True, text=True, timeout=30, check=True)
    return json.loads(result.stdout)


def parse_cli(argv: list[str], environment: dict[str, str] | None = None):
    assert argv[0] == "pdserve", argv
    with mock.patch.dict(os.environ, environment or {}):
        return cli.build_parser().parse_args(argv[1:])


def parse_service(service: dict):
    """The service's command as the CLI parses it inside the container, with its environment."""
    return parse_cli(container_argv(service), {k: str(v) for k, v in service.get("environment", {}).items()})


def test_the_system_is_redis_gateway_prefill_and_decode(services):
    assert set(services) == {"redis", "gateway", "prefill", "decode"}
    assert services["redis"]["image"].startswith("redis:7")
    assert "redis-cli ping" in services["redis"]["healthcheck"]["test"][-1]


@pytest.mark.parametrize("name", ["gateway", "prefill", "decode"])
def test_each_service_runs_its_cli_subcommand_with_flags_the_parser_accepts(services, name):
    args = parse_service(services[name])
    assert args.service == {"gateway": "pdserve.gateway.disaggregated.main", "prefill": "pdserve.prefill_svc.main", "decode": "pdserve.decode_svc.main"}[name]
    assert args.redis_url == "redis://:redis-pw@redis:6379/0"
    assert str(args.model) == "/models/model"
    assert {"redis": {"condition": "service_healthy"}} == services[name]["depends_on"]


@pytest.mark.parametrize("name", ["gateway", "prefill", "decode"])
def test_the_model_is_mounted_read_only_from_the_host_folder(services, name):
    (volume,) = services[name]["volumes"]
    assert volume["type"] == "bind"
    assert volume["target"] == "/models/model"
    assert volume["read_only"] is True
    assert Path(volume["source"]) == REPO_ROOT / "models" / "tiny"


def test_the_model_folder_comes_from_pdserve_model_dir(tmp_path):
    services = compose_config(PDSERVE_MODEL_DIR=str(tmp_path))["services"]
    assert {Path(services[name]["volumes"][0]["source"]) for name in services
            if name != "redis"} == {tmp_path}


@pytest.mark.parametrize("name", REPLICAS)
def test_replicas_share_host_ipc_and_pid_namespaces_for_cuda_ipc(services, name):
    assert services[name]["ipc"] == "host"
    assert services[name]["pid"] == "host"


@pytest.mark.parametrize("name", REPLICAS)
def test_replicas_reserve_both_gpus_so_each_sees_the_others_memory(services, name):
    (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
    assert "gpu" in device["capabilities"]
    assert [str(gpu) for gpu in device["device_ids"]] == ["0", "1"]
    args = parse_service(services[name])
    assert args.device == {"prefill": "cuda:0", "decode": "cuda:1"}[name]


def test_gpu_assignment_follows_environment_variables():
    services = compose_config(PREFILL_GPU="2", DECODE_GPU="3", PREFILL_DEVICE="cuda:1",
                              DECODE_DEVICE="cuda:0")["services"]
    for name in REPLICAS:
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert [str(gpu) for gpu in device["device_ids"]] == ["2", "3"]
    assert parse_service(services["prefill"]).device == "cuda:1"
    assert parse_service(services["decode"]).device == "cuda:0"


@pytest.mark.parametrize("name", REPLICAS)
def test_replicas_scale_without_name_or_host_port_clashes(services, name):
    service = services[name]
    assert "container_name" not in service
    assert "hostname" not in service
    assert not service.get("ports")


@pytest.mark.parametrize("name", REPLICAS)
def test_each_replica_container_advertises_its_own_hostname(services, name):
    args = parse_service(services[name])
    assert args.advertise_host == socket.gethostname()  # the shell's $(hostname)
    assert args.host == "0.0.0.0"


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_healthcheck_asks_grpc_health_on_the_served_port(services, name):
    served = parse_service(services[name])
    kind, *check_argv = services[name]["healthcheck"]["test"]
    assert kind == "CMD"
    check = parse_cli(check_argv)
    assert check.run is cli.run_healthcheck
    assert check.target == f"127.0.0.1:{served.port}"


def test_gateway_publishes_grpc_and_http_and_checks_http_health(services):
    gateway = services["gateway"]
    served = parse_service(gateway)
    published = {int(port["target"]): int(port["published"]) for port in gateway["ports"]}
    assert published == {served.grpc_port: 50051, served.http_port: 8000}
    kind, *check_argv = gateway["healthcheck"]["test"]
    assert kind == "CMD"
    check = parse_cli(check_argv)
    assert check.run is cli.run_healthcheck
    assert check.target == f"http://127.0.0.1:{served.http_port}/health"


def test_gateway_host_ports_and_transport_follow_environment_variables():
    gateway = compose_config(PDSERVE_GRPC_PORT="6000", PDSERVE_HTTP_PORT="6001",
                             PDSERVE_TRANSPORT="cuda_ipc")["services"]["gateway"]
    assert {int(port["published"]) for port in gateway["ports"]} == {6000, 6001}
    assert parse_service(gateway).transport == "cuda_ipc"


def test_the_secret_and_the_redis_password_are_required():
    result = run_compose_config({})
    assert result.returncode != 0 and "PDSERVE_" in result.stderr


@pytest.mark.parametrize("name", ["gateway", "prefill", "decode"])
def test_services_get_the_secret_in_their_environment_never_on_argv(services, name):
    argv = container_argv(services[name])
    assert not any(SECRETS["PDSERVE_INTERNAL_SECRET"] in arg or "redis-pw" in arg for arg in argv)
    assert services[name]["environment"]["PDSERVE_INTERNAL_SECRET"] == SECRETS["PDSERVE_INTERNAL_SECRET"]


def test_redis_requires_the_password_and_only_the_gateway_publishes_ports(services):
    assert "--requirepass" in " ".join(services["redis"]["command"])
    assert services["redis"]["environment"]["REDIS_PASSWORD"] == "redis-pw"
    assert "redis-pw" not in " ".join(services["redis"]["command"])
    assert [name for name, service in services.items() if service.get("ports")] == ["gateway"]


def mounted_secrets(compose: dict, name: str) -> dict[str, Path]:
    """Where each of the service's secrets appears in its container -> the host file it is."""
    return {f"/run/secrets/{secret['target']}": Path(compose["secrets"][secret["source"]]["file"])
            for secret in compose["services"][name]["secrets"]}


@pytest.mark.parametrize("name", ["gateway", "prefill", "decode"])
def test_each_service_mounts_the_ca_and_its_own_certificate_and_loads_them(name, tmp_path):
    certs = tmp_path / "certs"
    assert cli.main(["certs", "--out", str(certs)]) == 0
    compose = compose_config(PDSERVE_INTERNAL_TLS_DIR=str(certs))
    mounted = mounted_secrets(compose, name)
    assert sorted(path.name for path in mounted.values()) == sorted(["ca.pem", f"{name}.pem", f"{name}-key.pem"])
    assert all(path.parent == certs and path.is_file() for path in mounted.values())
    args = parse_service(compose["services"][name])
    tls = InternalTlsFiles(*(mounted[str(path)] for path in (
        args.internal_tls_ca, args.internal_tls_cert, args.internal_tls_key))).load(args.internal_tls_server_name)
    assert tls.server_name == cli.CERT_SHARED_HOST  # what `pdserve certs` names by default
    assert tls.cert_pem == (certs / f"{name}.pem").read_bytes()


def test_the_certificates_folder_defaults_to_certs_beside_the_file(services):
    compose = compose_config()
    assert {path.parent for name in services if name != "redis"
            for path in mounted_secrets(compose, name).values()} == {REPO_ROOT / "certs"}


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_healthcheck_presents_the_services_certificate(services, name):
    _, *check_argv = services[name]["healthcheck"]["test"]
    check = parse_cli(check_argv, {k: str(v) for k, v in services[name]["environment"].items()})
    served = parse_service(services[name])
    assert (check.internal_tls_ca, check.internal_tls_cert, check.internal_tls_key) == (
        served.internal_tls_ca, served.internal_tls_cert, served.internal_tls_key)
    assert check.internal_tls_server_name == served.internal_tls_server_name == cli.CERT_SHARED_HOST


@pytest.mark.parametrize("prefill_gpus, decode_gpus, expected", [
    ("0", "1,2,3", {"prefill-gpu0": "cuda:0", "decode-gpu1": "cuda:1", "decode-gpu2": "cuda:2", "decode-gpu3": "cuda:3"}),
    ("4", "6,2", {"prefill-gpu4": "cuda:1", "decode-gpu6": "cuda:2", "decode-gpu2": "cuda:0"}),
])
def test_compose_gpus_runs_one_replica_per_gpu_and_every_replica_sees_them_all(
        tmp_path, capsys, prefill_gpus, decode_gpus, expected):
    argv = ["compose-gpus", "--prefill-gpus", prefill_gpus, "--decode-gpus", decode_gpus,
            "--compose-file", str(COMPOSE_FILE)]
    assert cli.main(argv) == 0
    generated = tmp_path / "compose.gpus.yaml"
    generated.write_text(capsys.readouterr().out)
    services = compose_config(generated)["services"]
    assert set(services) == {"redis", "gateway", *expected}
    all_gpus = sorted({*prefill_gpus.split(","), *decode_gpus.split(",")})
    for name, device in expected.items():
        (reservation,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert sorted(str(gpu) for gpu in reservation["device_ids"]) == all_gpus
        args = parse_service(services[name])
        assert args.device == device
        assert args.service == ("pdserve.prefill_svc.main" if name.startswith("prefill") else "pdserve.decode_svc.main")
        assert services[name]["ipc"] == services[name]["pid"] == "host"
        assert services[name]["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        kind = name.split("-")[0]
        assert {secret["source"] for secret in services[name]["secrets"]} == {"internal-ca", f"{kind}-cert", f"{kind}-key"}
