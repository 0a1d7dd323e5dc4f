"""The Kubernetes manifests (deploy/k8s): what `kubectl apply -k deploy/k8s/overlays/{cpu,gpu}`
creates is valid and wired together.

For each overlay, rendered with tests/deploy/kustomize.py (checked against `kubectl kustomize`
where one is installed):
- every object is valid against the Kubernetes schema, strictly (no unknown fields), for the
  oldest Kubernetes the README names (1.27: gRPC probes) and the newest the schemas cover;
- each Deployment selects its own pods, each Service selects one Deployment's pods and targets
  ports they declare, and every volume mount names a volume of the pod;
- every pdserve container's command parses with pdserve's own parser, its `$(VAR)`s expanded as
  the kubelet does from variables it defines; the ports it binds on 0.0.0.0 are the ports it
  declares; --model is where the model volume is mounted; replicas advertise their pod IP;
- prefill, decode and the gateway have startup, readiness and liveness probes on declared
  ports; the gRPC probes ask for a service name the server reports in grpc.health.v1, and the
  HTTP probe for a path the gateway serves without an API key; the replicas' probes run
  `pdserve healthcheck` in the container, over the pod's mutual TLS, within the probe's timeout;
- gateway, prefill and decode mount the CA and their own certificate and key from the TLS Secret
  and name them in PDSERVE_INTERNAL_TLS_*, with the shared name `pdserve certs` gives them;
- the termination grace outlasts the drain (replicas) or the stop grace (gateway) plus preStop;
- every Secret reference (variables, volumes) names a key that the README's `kubectl create
  secret` commands make;
- prefill and decode mount a Memory emptyDir at /dev/shm and carry their llm-d role label;
- the network policies let the pods that call each other through, and no other pod;
- the GPU overlay gives prefill and decode one GPU each and cuda:0; the CPU overlay asks for no
  GPU, runs on the CPU, and its init container writes the tiny model where the others read it;
- the gateway moves KV over gRPC, the one transport that works between pods.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import kubernetes_validate
import pytest
import yaml

from pdserve import cli
from pdserve.cluster.replica_server import STOP_GRACE_S
from pdserve.gateway.disaggregated.main import STOP_GRACE_S as GATEWAY_STOP_GRACE_S
from tests.deploy.kustomize import render

pytestmark = pytest.mark.deploy

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
KUBERNETES_VERSIONS = ("1.27", kubernetes_validate.latest_version())
POD_IP = "10.1.2.3"  # what the downward API's status.podIP stands for here
PDSERVE_COMPONENTS = ("gateway", "prefill", "decode")
REPLICAS = ("prefill", "decode")
GPU = "nvidia.com/gpu"
# Who calls whom, and on which named container port.
CALLS = [("gateway", "prefill", "grpc"), ("gateway", "decode", "grpc"), ("prefill", "decode", "grpc"),
         ("gateway", "redis", "redis"), ("prefill", "redis", "redis"), ("decode", "redis", "redis")]
OUTSIDER_LABELS = {"app.kubernetes.io/name": "something-else"}


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def objects(overlay) -> list[dict]:
    return render(K8S / "overlays" / overlay)


def deployments(objects: list[dict]) -> dict[str, dict]:
    """component -> Deployment"""
    return {obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: obj
            for obj in objects if obj["kind"] == "Deployment"}


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def main_container(deployment: dict) -> dict:
    (container,) = pod_spec(deployment)["containers"]
    return container


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels, matchExpressions) against a set of labels."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        matched = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
                   "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not matched:
            return False
    return True


def container_env(container: dict) -> dict[str, str]:
    """The container's environment, with what the kubelet would put in for references."""
    env = {}
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "status.podIP", var
            env[var["name"]] = POD_IP
        elif "secretKeyRef" in source:
            env[var["name"]] = f"secret:{source['secretKeyRef']['key']}"
        else:
            env[var["name"]] = var["value"]
    return env


def expand(argument: str, env: dict[str, str]) -> str:
    """`$(VAR)` replaced by the variable, as the kubelet does; a VAR it lacks is an error here,
    where the kubelet would leave the text as it is."""
    def value(match: re.Match) -> str:
        assert match[1] in env, f"{argument!r} refers to ${match[1]}, which the container does not define"
        return env[match[1]]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value, argument)


def parse_pdserve(container: dict):
    """The container's command as `pdserve` parses it, in the container's environment."""
    from pdserve.cli import build_parser

    assert container.get("command") == ["pdserve"], container["name"]
    env = container_env(container)
    argv = [expand(argument, env) for argument in container["args"]]
    with mock.patch.dict(os.environ, env, clear=True):  # flag defaults read the environment
        try:
            return build_parser().parse_args(argv)
        except SystemExit as error:
            raise AssertionError(f"{container['name']}: pdserve rejects {argv}") from error


def declared_ports(container: dict) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container.get("ports", [])}


def mount_of(container: dict, path: str) -> dict:
    (mount,) = [mount for mount in container.get("volumeMounts", []) if mount["mountPath"] == path]
    return mount


def volume(deployment: dict, name: str) -> dict:
    (found,) = [volume for volume in pod_spec(deployment).get("volumes", []) if volume["name"] == name]
    return found


def prestop_s(container: dict) -> float:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def grpc_health_names(component: str) -> set[str]:
    """The names whose status the component's GrpcServer reports: "" and each of its services."""
    if component == "gateway":
        from pdserve.v1 import gateway_pb2
        services = [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name]
    elif component == "prefill":
        from pdserve.prefill_svc.main import SERVICE_NAMES as services
    else:
        from pdserve.decode_svc.main import SERVICE_NAMES as services
    return {"", *services}


def readme_secrets(tmp_path: Path) -> dict[str, set[str]]:
    """The name and keys of each Secret the README's `kubectl create secret` commands make; a
    `--from-file=DIR/` brings the files `pdserve certs` writes there (made in tmp_path)."""
    lines = (REPO / "README.md").read_text().splitlines()
    secrets = {}
    for start in [index for index, line in enumerate(lines) if "kubectl create secret generic" in line]:
        command = [lines[start]]
        while command[-1].rstrip().endswith("\\"):
            command.append(lines[start + len(command)])
        text = " ".join(command)
        keys = set(re.findall(r"--from-literal=([\w.-]+)=", text))
        for folder in re.findall(r"--from-file=(\S+)/", text):
            written = tmp_path / folder
            assert cli.main(["certs", "--out", str(written)]) == 0
            keys |= set(os.listdir(written))
        secrets[re.search(r"kubectl create secret generic (\S+)", text)[1]] = keys
    return secrets


def mounted_file(deployment: dict, path: str) -> tuple[str, str]:
    """(Secret, key) that the file at `path` in the main container comes from."""
    for mount in main_container(deployment).get("volumeMounts", []):
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            secret = volume(deployment, mount["name"])["secret"]
            relative = path[len(mount["mountPath"].rstrip("/")) + 1:]
            (key,) = [item["key"] for item in secret["items"] if item["path"] == relative]
            return secret["secretName"], key
    raise AssertionError(f"nothing is mounted at {path}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_schema_valid(objects, version):
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = f"{obj['kind']}/{obj['metadata']['name']} at {error.json_path}"
            raise AssertionError(f"{where}: {error.message}") from error


def test_overlay_has_every_component_once(objects):
    assert sorted(deployments(objects)) == sorted([*PDSERVE_COMPONENTS, "redis"])
    assert len([obj for obj in objects if obj["kind"] == "Deployment"]) == 4


def test_deployments_select_their_own_pods(objects):
    for obj in objects:
        if obj["kind"] == "Deployment":
            assert selects(obj["spec"]["selector"], obj["spec"]["template"]["metadata"]["labels"]), \
                obj["metadata"]["name"]


def test_services_select_one_deployment_and_target_declared_ports(objects):
    by_component = deployments(objects)
    services = [obj for obj in objects if obj["kind"] == "Service"]
    assert sorted(service["metadata"]["name"] for service in services) == ["pdserve-gateway", "pdserve-redis"]
    for service in services:
        selected = [deployment for deployment in by_component.values()
                    if selects({"matchLabels": service["spec"]["selector"]},
                               deployment["spec"]["template"]["metadata"]["labels"])]
        assert len(selected) == 1, service["metadata"]["name"]
        ports = declared_ports(main_container(selected[0]))
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in {*ports, *ports.values()}, (service["metadata"]["name"], port)


def test_volume_mounts_name_pod_volumes(objects):
    for deployment in deployments(objects).values():
        names = {volume["name"] for volume in pod_spec(deployment).get("volumes", [])}
        for container in pod_spec(deployment)["containers"] + pod_spec(deployment).get("initContainers", []):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in names, (deployment["metadata"]["name"], mount)


def test_pdserve_commands_parse(objects):
    for component in PDSERVE_COMPONENTS:
        deployment = deployments(objects)[component]
        assert parse_pdserve(main_container(deployment)).service.startswith(
            {"gateway": "pdserve.gateway.", "prefill": "pdserve.prefill_svc.", "decode": "pdserve.decode_svc."}[component])
        for container in pod_spec(deployment).get("initContainers", []):
            parse_pdserve(container)


def test_args_expand_only_defined_variables(objects):
    for deployment in deployments(objects).values():
        container = main_container(deployment)
        env = container_env(container)
        for argument in container.get("command", []) + container.get("args", []):
            expand(argument, env)


def test_bound_ports_are_the_declared_ports(objects):
    for component in PDSERVE_COMPONENTS:
        container = main_container(deployments(objects)[component])
        args = parse_pdserve(container)
        assert args.host == "0.0.0.0", component  # probes and other pods come in on the pod IP
        bound = {getattr(args, flag) for flag in ("port", "grpc_port", "http_port") if hasattr(args, flag)}
        assert bound == set(declared_ports(container).values()), component


def test_replicas_advertise_their_pod_ip(objects):
    for component in REPLICAS:
        assert parse_pdserve(main_container(deployments(objects)[component])).advertise_host == POD_IP


def test_model_flag_is_the_model_mount(objects):
    for component in PDSERVE_COMPONENTS:
        container = main_container(deployments(objects)[component])
        mount = mount_of(container, parse_pdserve(container).model)
        assert mount["name"] == "model" and mount.get("readOnly"), component


def healthcheck_of(container: dict, probe: dict) -> argparse.Namespace:
    """The probe's `pdserve healthcheck` command as it parses in the container's environment."""
    command = probe["exec"]["command"]
    assert command[:2] == ["pdserve", "healthcheck"], command
    with mock.patch.dict(os.environ, container_env(container), clear=True):
        return cli.build_parser().parse_args(command[1:])


def test_probes_hit_served_ports_and_health_names(objects):
    from pdserve.gateway.front.http_api import OPEN_PATHS

    for component in PDSERVE_COMPONENTS:
        container = main_container(deployments(objects)[component])
        ports = declared_ports(container)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[kind]
            if "exec" in probe:
                host, port = healthcheck_of(container, probe).target.rsplit(":", 1)
                assert host == "127.0.0.1" and int(port) in ports.values(), (component, kind)
            elif "grpc" in probe:
                assert probe["grpc"]["port"] in ports.values(), (component, kind)
                assert probe["grpc"].get("service", "") in grpc_health_names(component), (component, kind)
            else:
                http = probe["httpGet"]
                assert http["port"] in {*ports, *ports.values()}, (component, kind)
                assert http["path"] in OPEN_PATHS, (component, kind)  # the kubelet sends no API key


def test_replica_probes_ask_grpc_health_over_the_pods_mutual_tls_in_time(objects):
    for component in REPLICAS:
        container = main_container(deployments(objects)[component])
        served = parse_pdserve(container)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            check = healthcheck_of(container, container[kind])
            assert check.target == f"127.0.0.1:{served.port}", (component, kind)
            assert (check.internal_tls_ca, check.internal_tls_cert, check.internal_tls_key,
                    check.internal_tls_server_name) == (served.internal_tls_ca, served.internal_tls_cert,
                                                        served.internal_tls_key, served.internal_tls_server_name)
            assert check.timeout_s < container[kind].get("timeoutSeconds", 1), (component, kind)


def test_every_component_mounts_the_ca_and_its_own_certificate(objects):
    for component in PDSERVE_COMPONENTS:
        deployment = deployments(objects)[component]
        args = parse_pdserve(main_container(deployment))
        assert args.internal_tls_server_name == cli.CERT_SHARED_HOST, component  # what `pdserve certs` names
        files = {flag: mounted_file(deployment, str(getattr(args, flag)))
                 for flag in ("internal_tls_ca", "internal_tls_cert", "internal_tls_key")}
        assert {secret for secret, _ in files.values()} == {"pdserve-internal-tls"}, component
        assert [key for _, key in files.values()] == ["ca.pem", f"{component}.pem", f"{component}-key.pem"]


def test_gateway_is_ready_only_with_replicas(objects):
    probe = main_container(deployments(objects)["gateway"])["readinessProbe"]
    assert probe["httpGet"]["path"] == "/health"  # 200 only while prefill and decode replicas are live


def test_termination_grace_outlasts_shutdown(objects):
    for component in PDSERVE_COMPONENTS:
        deployment = deployments(objects)[component]
        container = main_container(deployment)
        args = parse_pdserve(container)
        shutdown_s = args.drain_timeout_s + (STOP_GRACE_S if component in REPLICAS else GATEWAY_STOP_GRACE_S)
        grace_s = pod_spec(deployment).get("terminationGracePeriodSeconds", 30)
        assert grace_s > prestop_s(container) + shutdown_s, component


def test_secret_references_are_keys_of_the_documented_secrets(objects, tmp_path):
    documented = readme_secrets(tmp_path)
    references = [(var["valueFrom"]["secretKeyRef"]["name"], var["valueFrom"]["secretKeyRef"]["key"])
                  for deployment in deployments(objects).values()
                  for container in pod_spec(deployment)["containers"] for var in container.get("env", [])
                  if "secretKeyRef" in var.get("valueFrom", {})]
    references += [(volume["secret"]["secretName"], item["key"]) for deployment in deployments(objects).values()
                   for volume in pod_spec(deployment).get("volumes", []) if "secret" in volume
                   for item in volume["secret"]["items"]]
    assert {name for name, _ in references} == {"pdserve-secrets", "pdserve-internal-tls"}
    for name, key in references:
        assert key in documented.get(name, set()), (name, key)


def test_pdserve_secrets_come_from_the_secret(objects):
    for component in PDSERVE_COMPONENTS:
        env = {var["name"]: var for var in main_container(deployments(objects)[component])["env"]}
        for name in ("PDSERVE_INTERNAL_SECRET", "PDSERVE_REDIS_URL"):
            assert "secretKeyRef" in env[name]["valueFrom"], (component, name)


def test_replicas_have_memory_backed_dev_shm(objects):
    for component in REPLICAS:
        deployment = deployments(objects)[component]
        mount = mount_of(main_container(deployment), "/dev/shm")
        assert volume(deployment, mount["name"])["emptyDir"]["medium"] == "Memory", component


def test_replicas_carry_their_role(objects):
    for component, deployment in deployments(objects).items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels.get("llm-d.ai/role") == (component if component in REPLICAS else None), component


def test_network_policies_let_callers_through_and_no_one_else(objects):
    by_component = deployments(objects)
    policies = [obj for obj in objects if obj["kind"] == "NetworkPolicy"]

    def allowed(client_labels: dict, server: str, port_name: str) -> bool:
        server_labels = by_component[server]["spec"]["template"]["metadata"]["labels"]
        port_number = declared_ports(main_container(by_component[server]))[port_name]
        isolating = [policy for policy in policies if selects(policy["spec"]["podSelector"], server_labels)]
        assert isolating, f"no policy isolates {server}"
        return any(
            any(selects(peer["podSelector"], client_labels) for peer in rule["from"])
            and any(port["port"] in (port_name, port_number) for port in rule.get("ports", [{"port": port_name}]))
            for policy in isolating for rule in policy["spec"].get("ingress", []))

    for client, server, port_name in CALLS:
        client_labels = by_component[client]["spec"]["template"]["metadata"]["labels"]
        assert allowed(client_labels, server, port_name), f"{client} cannot reach {server}"
        assert not allowed(OUTSIDER_LABELS, server, port_name), f"any pod reaches {server}"


def test_gateway_moves_kv_over_grpc(objects):
    assert parse_pdserve(main_container(deployments(objects)["gateway"])).transport == "grpc"


def test_gpus_on_replicas_in_gpu_overlay_only(objects, overlay):
    for component, deployment in deployments(objects).items():
        container = main_container(deployment)
        num_gpus = container.get("resources", {}).get("limits", {}).get(GPU, 0)
        assert GPU not in container.get("resources", {}).get("requests", {})  # limits alone, as the plugin wants
        if component in REPLICAS and overlay == "gpu":
            assert num_gpus == 1, component
            assert parse_pdserve(container).device == "cuda:0", component
        else:
            assert num_gpus == 0, (overlay, component)
        if component in REPLICAS and overlay == "cpu":
            assert parse_pdserve(container).device == "cpu", component


def test_cpu_replicas_size_their_kv_pool_within_their_memory_and_dev_shm(objects, overlay):
    if overlay != "cpu":
        pytest.skip("a GPU replica sizes its pool from its GPU")
    binary = {"Mi": 2**20, "Gi": 2**30}
    for component in REPLICAS:
        deployment = deployments(objects)[component]
        container = main_container(deployment)
        pool_bytes = parse_pdserve(container).kv_cache_memory
        request = container["resources"]["requests"]["memory"]
        shm_limit = volume(deployment, mount_of(container, "/dev/shm")["name"])["emptyDir"]["sizeLimit"]
        assert pool_bytes is not None, component  # the default would read the node's memory
        assert pool_bytes < int(request[:-2]) * binary[request[-2:]], component
        assert pool_bytes <= int(shm_limit[:-2]) * binary[shm_limit[-2:]], component


def test_cpu_overlay_makes_the_model_where_it_is_read(objects, overlay):
    if overlay != "cpu":
        pytest.skip("the GPU overlay reads the model from its volume")
    for component in PDSERVE_COMPONENTS:
        deployment = deployments(objects)[component]
        container = main_container(deployment)
        model_volume = mount_of(container, parse_pdserve(container).model)["name"]
        assert "emptyDir" in volume(deployment, model_volume), component
        (init,) = pod_spec(deployment)["initContainers"]
        out_dir = str(parse_pdserve(init).out_dir)
        assert mount_of(init, out_dir)["name"] == model_volume, component


def test_gpu_overlay_reads_the_model_from_its_claim(objects, overlay):
    if overlay != "gpu":
        pytest.skip("the CPU overlay makes its model")
    claims = {obj["metadata"]["name"] for obj in objects if obj["kind"] == "PersistentVolumeClaim"}
    for component in PDSERVE_COMPONENTS:
        deployment = deployments(objects)[component]
        container = main_container(deployment)
        model_volume = volume(deployment, mount_of(container, parse_pdserve(container).model)["name"])
        assert model_volume["persistentVolumeClaim"]["claimName"] in claims, component


def kustomize_version() -> int | None:
    """kubectl's kustomize major version, None without a kubectl that says."""
    if shutil.which("kubectl") is None:
        return None
    with contextlib.suppress(subprocess.SubprocessError, ValueError, KeyError):
        result = subprocess.run(["kubectl", "version", "--client", "-o", "json"],
                                capture_output=True, text=True, timeout=60, check=True)
        return int(json.loads(result.stdout)["kustomizeVersion"].lstrip("v").split(".")[0])
    return None


def test_renderer_agrees_with_kubectl(objects, overlay):
    version = kustomize_version()
    if version is None or version < 5:
        pytest.skip("needs kubectl with kustomize 5 or newer")
    result = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=120, check=True)

    def by_name(documents: list[dict]) -> dict[tuple[str, str], dict]:
        return {(document["kind"], document["metadata"]["name"]): document for document in documents}

    assert by_name(yaml.safe_load_all(result.stdout)) == by_name(objects)
