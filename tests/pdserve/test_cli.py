"""The `pdserve` command line: cheap to parse, and each service subcommand takes its flags from
that service's own `add_arguments`."""
import argparse
import dataclasses
import subprocess
import sys

import pytest

from pdserve import cli
from pdserve.checkpoints.model_ref import ResolvedModel


def folder(path) -> ResolvedModel:
    """A model up resolved to the folder `path`."""
    return ResolvedModel(path, path.name)


def test_parsing_a_client_command_imports_no_service_torch_or_engine():
    probe = ("import sys; from pdserve import cli; "
             "cli.build_parser().parse_args(['generate', 'hello']); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'prefill_svc', 'decode_svc', 'gateway', 'engine')))")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              check=True, timeout=60).stdout.strip()
    assert imported == "[]"


def test_service_subcommands_accept_their_services_flags():
    args = cli.build_parser().parse_args(
        ["decode", "--model", "/m", "--redis-url", "redis://r:6379/0", "--port", "7",
         "--reservation-timeout-s", "3"])
    assert args.service == "pdserve.decode_svc.main"
    assert (args.port, args.reservation_timeout_s) == (7, 3.0)
    args = cli.build_parser().parse_args(
        ["gateway", "--model", "/m", "--redis-url", "redis://r:6379/0", "--transport", "shm"])
    assert (args.service, args.transport) == ("pdserve.gateway.disaggregated.main", "shm")


def test_up_defaults_are_one_prefill_one_decode_on_cpu_with_the_standard_gateway_ports():
    args = cli.build_parser().parse_args(["up"])
    assert (args.prefill, args.decode, args.device, args.transport) == (1, 1, "cpu", "auto")
    assert (args.grpc_port, args.http_port) == (50051, 8000)
    assert args.model is None and args.redis_url is None


def test_generate_defaults_to_greedy_64_tokens_on_the_local_gateway():
    args = cli.build_parser().parse_args(["generate", "hi", "--stop", "a", "--stop", "b"])
    assert (args.gateway, args.max_tokens, args.temperature) == ("127.0.0.1:50051", 64, 0.0)
    assert args.stop == ["a", "b"]


def test_up_passes_its_dtype_to_every_replica(tmp_path):
    from pdserve.up import UpConfig, child_slots

    args = cli.build_parser().parse_args(["up", "--dtype", "bfloat16", "--prefill", "2"])
    assert cli.build_parser().parse_args(["up"]).dtype == "auto"
    config = UpConfig(
        model=str(tmp_path), num_prefill=args.prefill, num_decode=args.decode, redis_url=None,
        transport=args.transport, device=args.device, dtype=args.dtype, host=args.host,
        grpc_port=args.grpc_port, http_port=args.http_port, startup_timeout_s=1.0, shutdown_timeout_s=1.0)
    replicas = [slot.make_spec() for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret") if slot.name != "gateway"]
    assert len(replicas) == 3
    for spec in replicas:
        assert spec.argv[spec.argv.index("--dtype") + 1] == "bfloat16"


def test_up_gives_every_replica_the_kv_pool_it_is_given(tmp_path, capsys):
    from pdserve.up import UpConfig, child_slots

    args = cli.build_parser().parse_args(["up", "--kv-cache-memory", "1.5GiB", "--decode", "2"])
    config = UpConfig(
        model=str(tmp_path), num_prefill=args.prefill, num_decode=args.decode, redis_url=None,
        transport=args.transport, device=args.device, dtype=args.dtype, host=args.host,
        grpc_port=args.grpc_port, http_port=args.http_port, startup_timeout_s=1.0, shutdown_timeout_s=1.0,
        kv_cache_memory_bytes=args.kv_cache_memory)
    specs = {slot.name: slot.make_spec() for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret")}
    for name in ("prefill-0", "decode-0", "decode-1"):
        argv = specs[name].argv
        assert argv[argv.index("--kv-cache-memory") + 1] == str(3 * 2**29)
    assert "--kv-cache-memory" not in specs["gateway"].argv
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", "--kv-cache-memory", "lots"])
    assert "such as 4GiB, 512MiB or a number of bytes" in capsys.readouterr().err


def test_up_on_cpu_splits_the_hosts_kv_share_evenly_between_its_replicas(tmp_path):
    from pdserve.engine.cpu_kv_memory import HostMemory
    from pdserve.up import UpConfig, sized_kv_pools

    config = UpConfig(
        model=str(tmp_path), num_prefill=1, num_decode=3, redis_url=None, transport="auto", device="cpu",
        dtype="auto", host="127.0.0.1", grpc_port=1, http_port=2, startup_timeout_s=1.0, shutdown_timeout_s=1.0)
    host = HostMemory(available_bytes=32 * 2**30, shm_free_bytes=64 * 2**30)
    assert sized_kv_pools(config, lambda: host).kv_cache_memory_bytes == 4 * 2**30  # half of 32 GiB, by 4
    small_shm = HostMemory(available_bytes=32 * 2**30, shm_free_bytes=2**30)
    assert sized_kv_pools(config, lambda: small_shm).kv_cache_memory_bytes == 2**28  # the decode pools fit in it

    def unread() -> HostMemory:
        raise AssertionError("read the host's memory")
    given = dataclasses.replace(config, kv_cache_memory_bytes=123)
    assert sized_kv_pools(given, unread).kv_cache_memory_bytes == 123
    on_gpus = dataclasses.replace(config, device="cuda")
    assert sized_kv_pools(on_gpus, unread).kv_cache_memory_bytes is None  # each sizes its own from its GPU


def test_up_gives_every_child_the_resolved_folder_and_the_gateway_the_served_id(tmp_path):
    from pdserve.up import UpConfig, child_slots

    args = cli.build_parser().parse_args(["up"])
    config = UpConfig(
        model=args.model, num_prefill=1, num_decode=1, redis_url=None, transport=args.transport, device="cpu",
        dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        startup_timeout_s=1.0, shutdown_timeout_s=1.0)
    model = ResolvedModel(tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct")
    specs = {slot.name: slot.make_spec() for slot in child_slots(config, model, "redis://x", "s3cret")}
    assert {spec.argv[spec.argv.index("--model") + 1] for spec in specs.values()} == {str(tmp_path)}
    gateway = specs["gateway"].argv
    assert gateway[gateway.index("--served-model-name") + 1] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_model_fetch_takes_one_optional_model():
    assert cli.build_parser().parse_args(["model", "fetch"]).model is None
    assert cli.build_parser().parse_args(["model", "fetch", "org/name"]).model == "org/name"


def test_up_hands_children_the_secret_and_redis_url_in_their_environment_not_argv(tmp_path):
    from pdserve.up import LOOPBACK, UpConfig, child_slots

    args = cli.build_parser().parse_args(["up"])
    config = UpConfig(
        model=str(tmp_path), num_prefill=1, num_decode=1, redis_url=None, transport=args.transport,
        device="cuda", dtype=args.dtype, host="0.0.0.0", grpc_port=args.grpc_port, http_port=args.http_port,
        startup_timeout_s=1.0, shutdown_timeout_s=1.0)
    specs = {slot.name: slot.make_spec() for slot in child_slots(config, folder(tmp_path), "redis://:pw@h:1/0", "s3cret")}
    for name, spec in specs.items():
        assert not any("s3cret" in arg or "pw@" in arg for arg in spec.argv), name
        assert spec.env["PDSERVE_INTERNAL_SECRET"] == "s3cret"
        assert spec.env["PDSERVE_REDIS_URL"] == "redis://:pw@h:1/0"
    for name in ("prefill-0", "decode-0"):  # internal services listen on loopback only
        assert specs[name].argv[specs[name].argv.index("--host") + 1] == LOOPBACK


def test_cli_dtype_names_are_the_engines():
    from pdserve.engine.engine_config import DTYPES

    assert ("auto", *cli.DTYPE_NAMES) == DTYPES


def test_up_passes_its_weights_quantization_and_kv_cache_dtype_to_every_replica(tmp_path, monkeypatch):
    from pdserve.engine.engine_config import KV_CACHE_DTYPES, QUANTIZATIONS, QUANTIZED_WEIGHTS
    from pdserve.up import UpConfig, child_slots

    assert cli.QUANTIZATIONS == QUANTIZATIONS
    assert cli.KV_CACHE_DTYPES == KV_CACHE_DTYPES
    assert sorted(cli.QUANTIZED_WEIGHTS) == sorted(QUANTIZED_WEIGHTS)

    def replica_argvs(*flags: str) -> dict[str, tuple[str, ...]]:
        args = cli.build_parser().parse_args(["up", *flags])
        config = UpConfig(
            model=str(tmp_path), num_prefill=1, num_decode=2, redis_url=None, transport=args.transport,
            device="cpu", dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
            startup_timeout_s=1.0, shutdown_timeout_s=1.0, quantized_weights=args.quantized_weights,
            quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype)
        specs = [slot.make_spec() for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret")]
        for name, value in specs[0].env.items():  # where a child finds its Redis URL
            monkeypatch.setenv(name, value)
        return {spec.name: spec.argv for spec in specs}

    quantized = replica_argvs("--quantization", "int4", "--kv-cache-dtype", "int8",
                              "--quantized-weights", "as-stored-int8-activations")
    for name in ("prefill-0", "decode-0", "decode-1"):
        replica_args = cli.build_parser().parse_args(quantized[name][3:])  # after `python -m pdserve`
        assert (replica_args.quantization, replica_args.kv_cache_dtype) == ("int4", "int8")
        assert replica_args.quantized_weights == "as-stored-int8-activations"
        assert cli.build_parser().parse_args(replica_argvs()[name][3:]).kv_cache_dtype == "auto"
    assert "--quantization" not in quantized["gateway"]
    assert not any("--quantization" in argv for argv in replica_argvs().values())
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", "--quantization", "int3"])


def test_up_on_cpu_pins_each_replica_to_its_own_cpus(tmp_path, monkeypatch):
    from pdserve.up import UpConfig, child_slots

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    args = cli.build_parser().parse_args(["up"])
    config = UpConfig(
        model=str(tmp_path), num_prefill=1, num_decode=1, redis_url=None, transport=args.transport,
        device="cpu", dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        startup_timeout_s=1.0, shutdown_timeout_s=1.0)
    slots = {slot.name: slot for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret")}
    argv = {name: slot.make_spec().argv for name, slot in slots.items()}
    assert argv["prefill-0"][argv["prefill-0"].index("--cpus") + 1] == "0,1"
    assert argv["decode-0"][argv["decode-0"].index("--cpus") + 1] == "2,3"
    assert "--cpus" not in argv["gateway"]
    restarted = slots["decode-0"].make_spec().argv  # a restart: its CPUs kept, a fresh port
    assert restarted[restarted.index("--cpus") + 1] == "2,3"
    assert restarted[restarted.index("--port") + 1] != argv["decode-0"][argv["decode-0"].index("--port") + 1]
    on_gpu = child_slots(dataclasses.replace(config, device="cuda"), folder(tmp_path), "redis://x", "s3cret")
    assert all("--cpus" not in slot.make_spec().argv for slot in on_gpu)
    assert not any("--core-lease" in args for args in argv.values())


def test_up_on_cpu_has_each_prefill_replica_lend_its_cpus_to_a_decode_replica(tmp_path, monkeypatch):
    from pdserve.up import UpConfig, child_slots, num_core_leases

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    args = cli.build_parser().parse_args(["up"])
    assert args.lend_idle_cpus
    config = UpConfig(
        model=str(tmp_path), num_prefill=1, num_decode=2, redis_url=None, transport=args.transport,
        device="cpu", dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        startup_timeout_s=1.0, shutdown_timeout_s=1.0)
    assert num_core_leases(config) == 1
    assert num_core_leases(dataclasses.replace(config, num_prefill=2)) == 2
    assert num_core_leases(dataclasses.replace(config, device="cuda")) == 0
    assert num_core_leases(dataclasses.replace(config, lend_idle_cpus=False)) == 0
    assert num_core_leases(dataclasses.replace(config, num_prefill=3, num_decode=3)) == 0  # CPUs shared already
    lease = tmp_path / "cores-0"
    specs = [slot.make_spec() for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret", leases=[lease])]
    for name, value in specs[0].env.items():  # where a child finds its Redis URL
        monkeypatch.setenv(name, value)
    argv = {spec.name: spec.argv for spec in specs}
    prefill, decode = argv["prefill-0"], argv["decode-0"]
    assert prefill[prefill.index("--core-lease") + 1] == str(lease) and "--borrow-cpus" not in prefill
    assert decode[decode.index("--core-lease") + 1] == str(lease)
    assert decode[decode.index("--borrow-cpus") + 1] == prefill[prefill.index("--cpus") + 1] == "0,1"
    assert "--core-lease" not in argv["decode-1"] and "--core-lease" not in argv["gateway"]
    for name in ("prefill-0", "decode-0"):
        replica_args = cli.build_parser().parse_args(argv[name][3:])
        assert replica_args.core_lease == str(lease)


def test_up_gives_each_api_key_to_the_gateway_only_and_never_on_a_command_line(tmp_path, monkeypatch):
    from pdserve.gateway.front.api_keys import ENV_VAR
    from pdserve.up import UpConfig, child_slots

    monkeypatch.delenv(ENV_VAR, raising=False)
    args = cli.build_parser().parse_args(["up", "--api-key", "k1", "--api-key", "k2"])
    config = UpConfig(
        model=str(tmp_path), num_prefill=1, num_decode=1, redis_url=None, transport=args.transport,
        device=args.device, dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        startup_timeout_s=1.0, shutdown_timeout_s=1.0, api_keys=tuple(args.api_key))
    specs = {slot.name: slot.make_spec() for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret")}
    gateway = specs.pop("gateway")
    assert gateway.env[ENV_VAR] == "k1,k2"
    assert all(ENV_VAR not in spec.env for spec in specs.values())
    assert not any("k1" in arg or "k2" in arg for spec in (gateway, *specs.values()) for arg in spec.argv)


def test_up_passes_prefix_caching_to_the_replicas_and_routing_and_migrations_to_the_gateway(tmp_path, monkeypatch):
    from pdserve.up import UpConfig, child_slots

    def parse_child(spec) -> argparse.Namespace:
        for name, value in spec.env.items():  # where the child finds its Redis URL
            monkeypatch.setenv(name, value)
        return cli.build_parser().parse_args(spec.argv[3:])  # after `python -m pdserve`

    def children(*flags: str) -> dict[str, argparse.Namespace]:
        args = cli.build_parser().parse_args(["up", *flags])
        config = UpConfig(
            model=str(tmp_path), num_prefill=1, num_decode=1, redis_url=None, transport=args.transport,
            device="cpu", dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
            startup_timeout_s=1.0, shutdown_timeout_s=1.0, enable_prefix_caching=args.enable_prefix_caching,
            routing=args.routing, migration_limit=args.migration_limit)
        return {slot.name: parse_child(slot.make_spec()) for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret")}

    default = children()
    assert default["prefill-0"].enable_prefix_caching and default["decode-0"].enable_prefix_caching
    assert (default["gateway"].routing, default["gateway"].migration_limit) == ("cache-aware", 3)
    changed = children("--no-enable-prefix-caching", "--routing", "load", "--migration-limit", "0")
    assert not changed["prefill-0"].enable_prefix_caching and not changed["decode-0"].enable_prefix_caching
    assert (changed["gateway"].routing, changed["gateway"].migration_limit) == ("load", 0)


def test_up_on_cuda_gives_each_replica_its_own_gpu_as_its_device(tmp_path):
    from pdserve.gpu_placement import PlacementError
    from pdserve.up import UpConfig, child_slots, placed_on_gpus

    def replica_devices(argv: list[str], num_gpus: int) -> dict[str, str]:
        args = cli.build_parser().parse_args(["up", "--device", "cuda", *argv])
        config = UpConfig(
            model=str(tmp_path), num_prefill=args.prefill, num_decode=args.decode, redis_url=None,
            transport=args.transport, device=args.device, dtype=args.dtype, host=args.host,
            grpc_port=args.grpc_port, http_port=args.http_port, startup_timeout_s=1.0, shutdown_timeout_s=1.0,
            prefill_gpus=args.prefill_gpus, decode_gpus=args.decode_gpus)
        specs = [slot.make_spec() for slot in child_slots(placed_on_gpus(config, num_gpus), folder(tmp_path), "redis://x", "s")]
        return {spec.name: spec.argv[spec.argv.index("--device") + 1] for spec in specs if spec.name != "gateway"}

    assert replica_devices(["--prefill", "1", "--decode", "3"], num_gpus=4) == {
        "prefill-0": "cuda:0", "decode-0": "cuda:1", "decode-1": "cuda:2", "decode-2": "cuda:3"}
    assert replica_devices(["--prefill", "2", "--decode", "2", "--prefill-gpus", "2,3", "--decode-gpus", "0,1"],
                           num_gpus=4) == {"prefill-0": "cuda:2", "prefill-1": "cuda:3",
                                           "decode-0": "cuda:0", "decode-1": "cuda:1"}
    with pytest.raises(PlacementError, match="no CUDA device"):
        replica_devices([], num_gpus=0)
    args = cli.build_parser().parse_args(["up", "--decode-gpus", "1"])
    config = UpConfig(
        model=str(tmp_path), num_prefill=1, num_decode=1, redis_url=None, transport=args.transport,
        device="cpu", dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        startup_timeout_s=1.0, shutdown_timeout_s=1.0, decode_gpus=args.decode_gpus)
    with pytest.raises(PlacementError, match="need --device cuda"):
        placed_on_gpus(config, num_gpus=2)


def test_replicas_placed_on_one_gpu_split_its_memory_share(tmp_path):
    from pdserve.up import UpConfig, child_slots, placed_on_gpus

    args = cli.build_parser().parse_args(["up", "--device", "cuda", "--decode", "2", "--gpu-memory-utilization", "0.8"])
    config = UpConfig(
        model=str(tmp_path), num_prefill=args.prefill, num_decode=args.decode, redis_url=None,
        transport=args.transport, device=args.device, dtype=args.dtype, host=args.host, grpc_port=args.grpc_port,
        http_port=args.http_port, startup_timeout_s=1.0, shutdown_timeout_s=1.0,
        gpu_memory_utilization=args.gpu_memory_utilization)

    def shares(num_gpus: int) -> dict[str, tuple[str, float]]:
        specs = [slot.make_spec() for slot in child_slots(placed_on_gpus(config, num_gpus), folder(tmp_path), "redis://x", "s")]
        return {spec.name: (spec.argv[spec.argv.index("--device") + 1],
                            float(spec.argv[spec.argv.index("--gpu-memory-utilization") + 1]))
                for spec in specs if spec.name != "gateway"}

    assert shares(3) == {"prefill-0": ("cuda:0", 0.8), "decode-0": ("cuda:1", 0.8), "decode-1": ("cuda:2", 0.8)}
    assert shares(2) == {"prefill-0": ("cuda:0", 0.4), "decode-0": ("cuda:1", 0.8), "decode-1": ("cuda:0", 0.4)}


def test_up_hands_its_tool_call_parser_to_the_gateway(tmp_path):
    from pdserve.up import UpConfig, child_slots

    args = cli.build_parser().parse_args(["up", "--tool-call-parser", "llama3_json"])
    assert cli.build_parser().parse_args(["up"]).tool_call_parser == "hermes"
    config = UpConfig(
        model=str(tmp_path), num_prefill=1, num_decode=1, redis_url=None, transport=args.transport, device="cpu",
        dtype=args.dtype, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        startup_timeout_s=1.0, shutdown_timeout_s=1.0, tool_call_parser=args.tool_call_parser)
    specs = {slot.name: slot.make_spec() for slot in child_slots(config, folder(tmp_path), "redis://x", "s3cret")}
    gateway = specs["gateway"].argv
    assert gateway[gateway.index("--tool-call-parser") + 1] == "llama3_json"
    assert "--tool-call-parser" not in specs["decode-0"].argv
    gateway_args = cli.build_parser().parse_args(
        ["gateway", *gateway[gateway.index("gateway") + 1:], "--redis-url", "redis://x"])
    assert gateway_args.tool_call_parser == "llama3_json"
