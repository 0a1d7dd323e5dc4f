"""A peer engine reads a converted .gguf folder without its blocks file (bench/peer_model.py)."""
from pdserve.bench.peer_model import peer_model_dir
from pdserve.checkpoints.gguf_convert import BLOCKS_FILE_NAME, WEIGHTS_FILE_NAME


def test_a_converted_folder_is_seen_without_its_blocks(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("config.json", WEIGHTS_FILE_NAME, BLOCKS_FILE_NAME):
        (model_dir / name).write_text(name)
    for _ in range(2):  # a second call refreshes the same folder
        view = peer_model_dir(model_dir, tmp_path / "logs")
        assert sorted(path.name for path in view.iterdir()) == ["config.json", WEIGHTS_FILE_NAME]
        assert (view / WEIGHTS_FILE_NAME).read_text() == WEIGHTS_FILE_NAME


def test_a_folder_without_blocks_is_its_own_view(tmp_path):
    (tmp_path / WEIGHTS_FILE_NAME).write_text("weights")
    assert peer_model_dir(tmp_path, tmp_path / "logs") == tmp_path
