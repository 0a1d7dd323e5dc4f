"""Renders a kustomization the way `kubectl kustomize` does, for the subset deploy/k8s uses, so
that the manifest tests need no kubectl.

The subset: `resources` (YAML files, or folders holding a kustomization.yaml), `images`
(`newName`, `newTag`) and `patches` whose body is a JSON patch (RFC 6902: add, remove, replace,
test) from `path` or inline `patch`, aimed by a `target` of kind and exact name. Any other field
is an error rather than something silently left out; tests/deploy checks the result against
kubectl's where a kubectl is at hand.
"""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "resources", "images", "patches"})


def render(folder: Path) -> list[dict]:
    """The objects `kubectl kustomize folder` prints, in the order of its resources."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unsupported = kustomization.keys() - SUPPORTED_FIELDS
    if unsupported:
        raise ValueError(f"{folder}: kustomization fields this renderer lacks: {sorted(unsupported)}")
    objects = []
    for resource in kustomization.get("resources", []):
        path = folder / resource
        if path.is_dir():
            objects += render(path)
        else:
            objects += [document for document in yaml.safe_load_all(path.read_text()) if document]
    for patch in kustomization.get("patches", []):
        operations = yaml.safe_load((folder / patch["path"]).read_text() if "path" in patch else patch["patch"])
        targets = [obj for obj in objects if _is_target(obj, patch["target"])]
        if not targets:
            raise ValueError(f"{folder}: patch {patch} matches no object")
        for obj in targets:
            objects[objects.index(obj)] = apply_json_patch(obj, operations)
    for image in kustomization.get("images", []):
        if image.keys() - {"name", "newName", "newTag"}:
            raise ValueError(f"{folder}: image fields this renderer lacks: {sorted(image)}")
        for obj in objects:
            for container in _containers(obj):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return objects


def apply_json_patch(document: dict, operations: list[dict]) -> dict:
    """`document` with the RFC 6902 `operations` applied, each in turn; raises on a failed test."""
    document = copy.deepcopy(document)
    for operation in operations:
        *parents, last = _pointer(operation["path"])
        parent = document
        for key in parents:
            parent = parent[int(key) if isinstance(parent, list) else key]
        op = operation["op"]
        if op == "test":
            actual = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if actual != operation["value"]:
                raise ValueError(f"test {operation['path']}: expected {operation['value']!r}, found {actual!r}")
        elif op == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op == "replace":
            if isinstance(parent, dict) and last not in parent:
                raise ValueError(f"replace {operation['path']}: nothing there")
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(operation["value"])
        elif op == "add" and isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(operation["value"]))
        elif op == "add":
            parent[last] = copy.deepcopy(operation["value"])
        else:
            raise ValueError(f"JSON patch op this renderer lacks: {op}")
    return document


def _pointer(path: str) -> list[str]:
    return [token.replace("~1", "/").replace("~0", "~") for token in path.split("/")[1:]]


def _is_target(obj: dict, target: dict) -> bool:
    unsupported = target.keys() - {"kind", "name"}
    if unsupported:
        raise ValueError(f"patch target fields this renderer lacks: {sorted(unsupported)}")
    return obj["kind"] == target.get("kind", obj["kind"]) and obj["metadata"]["name"] == target.get(
        "name", obj["metadata"]["name"])


def _containers(obj: dict) -> list[dict]:
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    return pod.get("containers", []) + pod.get("initContainers", [])
