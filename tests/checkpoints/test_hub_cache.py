"""A hub id resolves to its snapshot in huggingface_hub's cache, found where huggingface_hub looks
(HF_HUB_CACHE first); offline and not cached, it is one line naming the id and the cache folder."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.checkpoints.errors import ModelNotFoundError
from pdserve.checkpoints.hub_cache import hub_cache_dir, is_offline, looks_like_hub_id
from pdserve.checkpoints.model_ref import resolve_model
from pdserve.engine.config import ModelConfig

REVISION = "0123456789abcdef0123456789abcdef01234567"


def cache_model(hub_cache: Path, repo_id: str, model_dir: str) -> Path:
    """Lays `model_dir` out as huggingface_hub caches `repo_id` at main; returns the snapshot."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def offline(tmp_path: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def test_a_cached_hub_id_resolves_offline_to_its_snapshot_served_under_its_id(tiny_model, tmp_path):
    snapshot = cache_model(tmp_path / "hub", "acme/tiny-chat", tiny_model())
    model = resolve_model("acme/tiny-chat", offline(tmp_path))
    assert (model.model_dir, model.served_name) == (snapshot, "acme/tiny-chat")
    assert ModelConfig.from_dir(model.model_dir).num_layers == 4


def test_an_uncached_hub_id_offline_is_one_line_naming_the_id_and_the_cache(tmp_path):
    with pytest.raises(ModelNotFoundError) as raised:
        resolve_model("acme/absent", offline(tmp_path))
    message = str(raised.value)
    assert "acme/absent" in message and str(tmp_path / "hub") in message and "HF_HUB_OFFLINE" in message
    assert "\n" not in message


def test_the_command_line_says_so_in_one_line_and_exits_2(tmp_path):
    fetched = subprocess.run([sys.executable, "-m", "pdserve", "model", "fetch", "acme/absent"], capture_output=True,
                             text=True, timeout=120, env={**os.environ, **offline(tmp_path)})
    assert fetched.returncode == 2
    assert fetched.stderr.splitlines()[-1].startswith("pdserve: acme/absent is not in the Hugging Face cache at "
                                                      f"{tmp_path / 'hub'}")
    assert "Traceback" not in fetched.stderr


def test_a_local_folder_wins_over_a_hub_id_spelled_the_same(tiny_model, tmp_path, monkeypatch):
    shutil.copytree(tiny_model(), tmp_path / "acme" / "tiny-chat")
    monkeypatch.chdir(tmp_path)
    model = resolve_model("acme/tiny-chat", offline(tmp_path))
    assert (model.model_dir, model.served_name) == (Path("acme/tiny-chat"), "tiny-chat")


@pytest.mark.parametrize("environ, expected", [
    ({"HF_HUB_CACHE": "/a", "HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c"}, "/a"),
    ({"HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c", "XDG_CACHE_HOME": "/d"}, "/b"),
    ({"HF_HOME": "/c", "XDG_CACHE_HOME": "/d"}, "/c/hub"),
    ({"XDG_CACHE_HOME": "/d"}, "/d/huggingface/hub"),
    ({}, str(Path.home() / ".cache" / "huggingface" / "hub")),
])
def test_the_cache_folder_follows_huggingface_hubs_precedence(environ, expected):
    assert hub_cache_dir(environ) == Path(expected)


def test_offline_is_either_variable_set_to_a_true_word():
    assert is_offline({"HF_HUB_OFFLINE": "1"}) and is_offline({"TRANSFORMERS_OFFLINE": "true"})
    assert not is_offline({}) and not is_offline({"HF_HUB_OFFLINE": "0"})


@pytest.mark.parametrize("text, is_hub_id", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", True), ("org/name.v2", True), ("name", False), ("./org/name", False),
    ("../org/name", False), ("/abs/path", False), ("org/name/extra", False), ("org/", False),
])
def test_a_hub_id_is_org_slash_name(text, is_hub_id):
    assert looks_like_hub_id(text) is is_hub_id
