"""Datasets that stay where they live: shard URLs, how they are named, and fetching one shard's bytes once.

A URL is ``http(s)://...`` or a ``pipe:`` command that writes the shard to stdout
(``pipe:aws s3 cp s3://bucket/train/shard-000003.tar -``). ``--data`` may give a brace
pattern of them (``.../shard-{000000..000099}.tar``, expanded by WebDataset's
``expand_urls``: '::' joins patterns, ``WDS_`` variables are substituted) or a local text
file with one per line. A URL's *location* is its path without a query (for ``pipe:``, the
last word of the command that holds a '/'), and shards are named by their location
relative to the longest common folder of all of them (``url_root``), as local shards are
named relative to the dataset directory: ``train/shard-000003.tar``.

``fetch`` streams a URL once into memory through WebDataset's openers (``gopen``'s ``Pipe``:
curl for http(s), a shell for ``pipe:``), computing the sha256 of the bytes as they
arrive. A transient failure (a dropped connection, a timeout, HTTP 5xx/408/429, a
``pipe:`` command exiting non-zero) is retried from the start, ``Retry.attempts`` times in
all with doubling backoff; a permanent one (HTTP 404, a command not found) is not. Either
way the error is one line naming the URL, and no byte of the failed attempt is used.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from urllib.parse import urlsplit, urlunsplit

from webdataset.gopen import Pipe, gopen
from webdataset.shardlists import expand_urls

from tokweight.pipeline.extract.config import Retry
from tokweight.store.manifest import is_url

__all__ = ["is_url", "is_url_data", "expand", "location", "url_root", "url_name", "sibling", "Fetched",
           "FetchError", "ShardChangedError", "fetch", "fetch_if_present"]

CHUNK = 1 << 20  # bytes per read of a stream
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
TRANSIENT_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})
TRANSIENT_CURL = frozenset({5, 6, 7, 16, 18, 28, 35, 52, 55, 56, 92})  # resolve, connect, partial, timeout, reset
PERMANENT_SHELL = frozenset({126, 127})  # a pipe: command that cannot run or does not exist
_STATUS = "tokweight-http-status "  # curl --write-out marker on stderr


# ---------------------------------------------------------------- naming


def is_url_data(data: str | Path) -> bool:
    """Whether ``--data`` names URLs: a URL pattern, or a local file that is not a tar (a list of URLs)."""
    if is_url(str(data)):
        return True
    path = Path(data)
    return path.is_file() and not path.name.endswith(TAR_SUFFIXES)


def expand(data: str | Path) -> list[str]:
    """The URLs of ``--data``: a pattern expanded, or a URL list's lines (blank and '#' lines aside) expanded."""
    if is_url(str(data)):
        return expand_urls(str(data))
    urls = []
    for lineno, line in enumerate(Path(data).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not is_url(line):
            raise ValueError(f"{data}: line {lineno} is not a URL (http://, https:// or pipe:): {line!r}")
        urls += expand_urls(line)
    return urls


def location(url: str) -> str:
    """Where the shard lives: an http(s) URL without query or fragment, or the last word of a ``pipe:``
    command that holds a '/' (its object's path or URL); the command itself if none does."""
    if url.startswith("pipe:"):
        words = [w for w in shlex.split(url[len("pipe:"):]) if "/" in w]
        return words[-1] if words else url
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def url_root(urls: list[str]) -> str:
    """The longest common folder (ending in '/') of the URLs' locations: what shard names are relative to."""
    prefix = os.path.commonprefix([location(u) for u in urls])
    return prefix[: prefix.rfind("/") + 1]


def url_name(root: str, url: str) -> str:
    """The shard's name: its location relative to ``root``; ValueError if it is not below it."""
    where = location(url)
    if not where.startswith(root) or where == root:
        raise ValueError(f"{url} is not below {root}")
    return where[len(root):]


def sibling(url: str, root: str, name: str) -> str:
    """The URL of ``root + name``, opened the way ``url`` is (for ``pipe:``, the same command on it)."""
    if url.startswith("pipe:"):
        return url.replace(location(url), root + name, 1)
    return root + name


# ---------------------------------------------------------------- fetching


class FetchError(OSError):
    """A URL could not be read; the message is one line naming it. ``transient``: the last failure was one
    that a retry might have cured (the attempts ran out)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class ShardChangedError(ValueError):
    """A URL's bytes are not those its part was made of (another size or sha256); one line naming it."""


@dataclass(frozen=True)
class Fetched:
    """A URL's bytes, read once, and their sha256 (computed while they were streamed)."""

    url: str
    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


class _Failed(Exception):
    def __init__(self, detail: str, transient: bool):
        super().__init__(detail)
        self.detail, self.transient = detail, transient


def _open(url: str):
    """A readable stream of the URL's bytes: curl under WebDataset's ``Pipe`` for http(s) (its own retries
    off: ``fetch`` retries, with an injectable backoff), WebDataset's ``gopen`` for ``pipe:``."""
    if url.startswith("pipe:"):
        return gopen(url, "rb", bufsize=CHUNK)
    command = ["curl", "--fail", "--silent", "--show-error", "--location", "--globoff", "--connect-timeout", "30",
               "--speed-limit", "1", "--speed-time", "60", "--write-out", "%{stderr}" + _STATUS + "%{http_code}\n", url]
    return Pipe(command, mode="rb", bufsize=CHUNK, ignore_status=[141, 23], stderr=PIPE)


def _attempt(url: str) -> tuple[bytes, str]:
    """(bytes, sha256) of one complete read; _Failed saying why not and whether a retry might help."""
    try:
        stream = _open(url)
    except (OSError, ValueError) as exn:  # no curl, no shell, WDS_SECURE refusing pipe:
        raise _Failed(f"cannot open: {exn}", transient=False) from None
    digest, chunks = hashlib.sha256(), []
    try:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            chunks.append(chunk)
        stream.close()  # waits for the process: a bad exit status raises here if not while reading
    except (OSError, ValueError) as exn:
        raise _failure(url, stream, exn) from None
    finally:
        _close_stderr(stream)
    return b"".join(chunks), digest.hexdigest()


def _close_stderr(stream) -> None:
    errors = getattr(getattr(stream, "proc", None), "stderr", None)
    if errors is not None:
        errors.close()


def _failure(url: str, stream, exn: Exception) -> _Failed:
    """Why a read failed, from the process's exit status (and curl's message and HTTP status)."""
    if not isinstance(stream, Pipe):
        return _Failed(f"read failed: {exn}", transient=True)
    stream.stream.close()
    status = stream.proc.wait()
    if url.startswith("pipe:"):
        return _Failed(f"the command exited with status {status}", transient=status not in PERMANENT_SHELL)
    lines = stream.proc.stderr.read().decode(errors="replace").splitlines()
    http = next((int(line[len(_STATUS):]) for line in lines if line.startswith(_STATUS)), 0)
    said = "; ".join(line for line in lines if line and not line.startswith(_STATUS)) or f"curl exit {status}"
    transient = http in TRANSIENT_HTTP if status == 22 else status in TRANSIENT_CURL
    return _Failed(said, transient)


def fetch(url: str, retry: Retry = Retry(), expect: tuple[int, str] | None = None) -> Fetched:
    """The URL's bytes, read whole, retried per ``retry``; FetchError (one line) if they cannot be read.

    expect: (size, sha256) that the bytes must have (a part was made of them): ShardChangedError otherwise.
    """
    for attempt in range(1, retry.attempts + 1):
        try:
            fetched = Fetched(url, *_attempt(url))
            break
        except _Failed as failed:
            if not failed.transient or attempt == retry.attempts:
                tries = f"gave up after {attempt} attempts" if failed.transient else "not retried"
                raise FetchError(f"{url}: {failed.detail} ({tries}); nothing read from it was used",
                                 failed.transient) from None
            retry.wait(attempt)
    if expect is not None and (fetched.size, fetched.sha256) != tuple(expect):
        raise ShardChangedError(f"shard {url} changed since its part was written: it now has {fetched.size} bytes, "
                                f"sha256 {fetched.sha256[:12]}..., the part was made of {expect[0]} bytes, sha256 "
                                f"{expect[1][:12]}...")
    return fetched


def fetch_if_present(url: str, retry: Retry = Retry()) -> bytes | None:
    """An optional file's bytes (``dataset.json``), or None where it is not there: a permanent failure (HTTP
    404), or for ``pipe:``, whose failures cannot be told apart, any failure of a single try."""
    try:
        return fetch(url, Retry(attempts=1) if url.startswith("pipe:") else retry).data
    except FetchError as error:
        if error.transient and not url.startswith("pipe:"):
            raise
        return None
