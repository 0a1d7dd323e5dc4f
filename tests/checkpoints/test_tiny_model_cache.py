"""The cached tiny model: written once, complete or absent, never rewritten."""
from pathlib import Path

from pdserve.checkpoints.tiny_model_cache import TINY_MODEL_NAME, cache_root, ensure_tiny_model


def test_cache_root_follows_xdg_cache_home_else_home():
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/pdserve")
    assert cache_root({}) == Path.home() / ".cache" / "pdserve"
    assert cache_root({"XDG_CACHE_HOME": ""}) == Path.home() / ".cache" / "pdserve"


def test_first_call_writes_a_complete_model_and_leaves_no_staging_folder(tmp_path):
    model_dir = ensure_tiny_model(tmp_path)
    assert model_dir == tmp_path / "models" / TINY_MODEL_NAME
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        path.name for path in model_dir.iterdir()}
    assert [path.name for path in model_dir.parent.iterdir()] == [TINY_MODEL_NAME]


def test_an_existing_model_is_reused_and_a_stray_staging_folder_is_ignored(tmp_path):
    models = tmp_path / "models"
    (models / TINY_MODEL_NAME).mkdir(parents=True)
    (models / TINY_MODEL_NAME / "config.json").write_text("{}")
    (models / f".{TINY_MODEL_NAME}.interrupted").mkdir()
    assert ensure_tiny_model(tmp_path) == models / TINY_MODEL_NAME
    assert (models / TINY_MODEL_NAME / "config.json").read_text() == "{}"
