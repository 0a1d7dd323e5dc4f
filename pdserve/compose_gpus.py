"""`pdserve compose-gpus`: compose.yaml rewritten to run one replica per GPU.

    pdserve compose-gpus --prefill-gpus 0 --decode-gpus 1,2,3 > compose.gpus.yaml
    docker compose -f compose.gpus.yaml up

The `prefill` and `decode` services of compose.yaml become one service per listed host GPU
(`prefill-gpu0`, `decode-gpu1`, ...), each otherwise exactly as compose.yaml defines it. Every
one of them reserves all the listed GPUs, so that all containers number the GPUs alike (from 0,
in host order: CUDA_DEVICE_ORDER=PCI_BUS_ID) and CUDA IPC reaches each decode replica's memory
from every prefill replica; each runs on its own GPU's number in that shared order. The output
is JSON, which Compose reads as YAML.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path

REPLICA_SERVICES = ("prefill", "decode")


def per_gpu_services(compose: dict, gpus_of: dict[str, Sequence[int]]) -> dict:
    """`compose` (as loaded, anchors resolved) with each service named in `gpus_of` replaced by
    one copy per host GPU it lists."""
    all_gpus = sorted({gpu for gpus in gpus_of.values() for gpu in gpus})
    services = {name: service for name, service in compose["services"].items() if name not in gpus_of}
    for name, gpus in gpus_of.items():
        for gpu in gpus:
            service = copy.deepcopy(compose["services"][name])
            (reservation,) = service["deploy"]["resources"]["reservations"]["devices"]
            reservation["device_ids"] = [str(g) for g in all_gpus]
            service["command"] = _with_device(service["command"], f"cuda:{all_gpus.index(gpu)}")
            services[f"{name}-gpu{gpu}"] = service
    return {key: value for key, value in compose.items() if not key.startswith("x-")} | {"services": services}


def render(compose_file: Path, prefill_gpus: Sequence[int], decode_gpus: Sequence[int]) -> str:
    import yaml

    compose = yaml.safe_load(compose_file.read_text())
    return json.dumps(per_gpu_services(compose, {"prefill": prefill_gpus, "decode": decode_gpus}), indent=2) + "\n"


def _with_device(command: list[str], device: str) -> list[str]:
    at = command.index("--device") + 1
    return [*command[:at], device, *command[at + 1:]]
