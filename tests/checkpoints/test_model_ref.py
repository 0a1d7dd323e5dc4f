"""What `--model` may name, and the folder and served id each resolves to; and the services' side
of it: --served-model-name defaults to the resolved id, and resolving a .gguf loads no torch."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.checkpoints import default_model
from pdserve.checkpoints.errors import ModelNotFoundError
from pdserve.checkpoints.model_ref import ResolvedModel, resolve_model
from pdserve.checkpoints.tiny_model_cache import TINY_MODEL_NAME
from pdserve.cluster.service_args import add_model_argument, add_served_model_name_argument, with_resolved_model


def test_a_folder_is_served_as_it_is_under_its_name(tiny_model, tmp_path):
    model = resolve_model(tiny_model(), {"XDG_CACHE_HOME": str(tmp_path)})
    assert model == ResolvedModel(Path(tiny_model()), Path(tiny_model()).name)
    assert not (tmp_path / "pdserve").exists()


def test_a_gguf_file_is_served_from_its_converted_folder_under_its_stem(gguf_file, tmp_path):
    model = resolve_model(str(gguf_file("mixed")), {"XDG_CACHE_HOME": str(tmp_path)})
    assert model.model_dir.parent == tmp_path / "pdserve" / "checkpoints"
    assert model.served_name == "tiny-mixed"
    assert (model.model_dir / "model.safetensors").is_file()


def test_tiny_is_the_cached_random_model(tmp_path):
    model = resolve_model("tiny", {"XDG_CACHE_HOME": str(tmp_path)})
    assert model == ResolvedModel(tmp_path / "pdserve" / "models" / TINY_MODEL_NAME, TINY_MODEL_NAME)


def test_no_model_is_the_default_model_under_its_hub_id(tmp_path, monkeypatch):
    fetched = []

    def fake_ensure(root, environ):
        fetched.append(root)
        return root / "checkpoints" / "default"

    monkeypatch.setattr(default_model, "ensure_default_model", fake_ensure)
    model = resolve_model(None, {"XDG_CACHE_HOME": str(tmp_path)})
    assert model == ResolvedModel(tmp_path / "pdserve" / "checkpoints" / "default",
                                  "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert fetched == [tmp_path / "pdserve"]


@pytest.mark.parametrize("name", ["./missing", "/no/such/folder", "missing.gguf", "org/name.gguf", "just-a-name"])
def test_a_name_that_is_nothing_of_these_is_a_one_line_error(name, tmp_path):
    with pytest.raises(ModelNotFoundError, match=f"^{name}: no such model folder or .gguf file"):
        resolve_model(name, {"XDG_CACHE_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_argument(parser)
    add_served_model_name_argument(parser)
    return parser.parse_args(argv)


def test_services_serve_the_resolved_folder_under_its_id_unless_told_another(gguf_file, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    resolved = with_resolved_model(parse("--model", str(gguf_file("mixed"))))
    assert Path(resolved.model).parent == tmp_path / "pdserve" / "checkpoints"
    assert resolved.served_model_name == "tiny-mixed"
    named = with_resolved_model(parse("--model", str(gguf_file("mixed")), "--served-model-name", "chat"))
    assert (named.model, named.served_model_name) == (resolved.model, "chat")


def test_resolving_a_gguf_file_loads_no_torch(gguf_file, tmp_path):
    code = ("import sys\nfrom pdserve.checkpoints.model_ref import resolve_model\n"
            f"resolve_model({str(gguf_file('mixed'))!r}, {{'XDG_CACHE_HOME': {str(tmp_path)!r}}})\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "False"
