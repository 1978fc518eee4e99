"""WebDataset shard IO: write samples as ``<key>.json`` members, find shards, stream them back.

Reading never loses samples silently: before a shard is streamed its tar headers are
walked once (``scan_shard``) and a shard without a complete last member and an
end-of-archive block raises ``SampleError('truncated-shard')``; WebDataset on its own
stops quietly at a cut that falls on a 512-byte block boundary. The scan's members are
then read by offset and grouped into samples by WebDataset's own ``group_by_keys``, so
the headers are parsed once. Keys with a dot, which WebDataset merges into the key before
the dot (it splits a member name at the key's first dot), are found from the member names first and
reported under their real key. Every stage (extraction, training, evaluation) reads shards through ``iter_shard``,
so a bad sample is found, and named, the same way in each: its key and the shard's name
relative to the dataset root (``shard_name``).

A shard given by URL (pipeline.data.urls: http(s), ``pipe:``) is fetched once into memory, its
sha256 computed while it streams, and then checked and read exactly as a local file is:
``scan_shard`` and ``iter_shard`` take its bytes (``data``) in place of a path.
"""

from __future__ import annotations

import glob
import io
import json
import os
import posixpath  # tar member names are '/'-separated
import re
import tarfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

import webdataset as wds
from webdataset.tariterators import base_plus_ext, group_by_keys

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.samples import Sample, check_key, parse_sample, sample_to_json
from tokweight.pipeline.extract.config import Retry
from tokweight.pipeline.data.urls import (expand, fetch, fetch_if_present, is_url, is_url_data, sibling, url_name,
                                          url_root)

ErrorHandler = Callable[[SampleError], None]
_META = re.compile(r"__[^/]*__($|/)")  # members WebDataset skips (tariterators.tar_file_iterator)


# ---------------------------------------------------------------- writing


def encode_sample(sample: Sample) -> dict:
    """The raw dict ShardWriter stores: ``<key>.json`` as compact UTF-8 JSON."""
    payload = json.dumps(sample_to_json(sample), ensure_ascii=False, separators=(",", ":"))
    return {"__key__": sample.key, "json": payload.encode("utf-8")}


def write_shards(samples: Iterable[Sample], out_dir: str | Path, *, shard_size: int,
                 pattern: str = "shard-%06d.tar") -> list[Path]:
    """Write samples in order, ``shard_size`` per shard; returns the shard paths in order.

    ``mtime=0`` and fixed user/group make identical inputs give byte-identical tars.
    Each shard is written under ``<name>.tmp`` and renamed when closed. No samples, no
    shards. Keys must be valid (no '.' or '/') and unique across the call.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def publish(tmp_name: str) -> None:
        final = Path(tmp_name[: -len(".tmp")])
        os.replace(tmp_name, final)
        written.append(final)

    writer, seen = None, set()
    try:
        for sample in samples:
            check_key(sample.key)
            if sample.key in seen:
                raise SampleError("duplicate-key", "key written twice", key=sample.key)
            seen.add(sample.key)
            if writer is None:  # created lazily: ShardWriter opens its first file at once
                writer = wds.ShardWriter(str(out_dir / pattern) + ".tmp", maxcount=shard_size,
                                         post=publish, verbose=0, mtime=0, encoder=False)
            writer.write(encode_sample(sample))
    finally:
        if writer is not None:
            writer.close()
    return written


def prepare_output_dir(out_dir: str | Path, *, overwrite: bool = False) -> None:
    """Create ``out_dir``, refusing to mix a new dataset with an old one (readers glob every *.tar).

    With ``overwrite``, every ``*.tar`` and ``dataset.json`` below it is deleted instead.
    """
    out_dir = Path(out_dir)
    old = [p for p in out_dir.rglob("*") if p.suffix == ".tar" or p.name == "dataset.json"] if out_dir.exists() else []
    if old and not overwrite:
        raise FileExistsError(f"{out_dir} already holds a dataset ({old[0].name}, ...); "
                              "choose an empty folder or pass overwrite=True")
    for p in old:
        p.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------- finding


def resolve_shards(data: str | Path) -> tuple[Path, list[Path]] | tuple[str, list[str]]:
    """(root, sorted shard paths) for a directory (every ``*.tar`` below it) or a glob; (root URL, sorted
    URLs) for URLs (``pipeline.data.urls``: a pattern or a file listing them).

    ``root`` is what shard names are relative to: the directory itself, or the longest
    common parent directory of the glob's matches or of the URLs' locations.
    """
    if is_url_data(data):
        return _resolve_urls(data)
    path = Path(data)
    if path.is_dir():
        root, shards = path, [p for p in path.rglob("*.tar") if p.is_file()]
    else:
        shards = [Path(p) for p in glob.glob(str(data), recursive=True) if Path(p).is_file()]
        root = Path(os.path.commonpath([str(p.parent) for p in shards])) if shards else path
    if not shards:
        raise FileNotFoundError(f"no .tar shards found for {str(data)!r} (expected a directory or a glob pattern): "
                                "write them with tokweight synth or tokweight convert")
    return root, sorted(shards, key=lambda p: shard_name(root, p))


def _resolve_urls(data: str | Path) -> tuple[str, list[str]]:
    urls = expand(data)
    if not urls:
        raise FileNotFoundError(f"no shard URLs in {str(data)!r}: list one URL per line")
    root = url_root(urls)
    names: dict[str, str] = {}
    for url in urls:
        name = url_name(root, url)
        if name in names:
            raise ValueError(f"{url} and {names[name]} both name the shard {name!r} (a URL listed twice?): "
                             "list each shard once")
        names[name] = url
    return root, [names[name] for name in sorted(names)]


def shard_name(root: str | Path, path: str | Path) -> str:
    """The shard's name: its posix path relative to ``root``, e.g. ``train/shard-000000.tar`` (a URL's:
    its location relative to the root URL); ValueError if it is not below ``root``."""
    if is_url(str(path)):
        return url_name(str(root), str(path))
    return Path(path).relative_to(Path(root)).as_posix()


def dataset_json(data: str | Path, retry: Retry = Retry()) -> dict | None:
    """The ``dataset.json`` beside a dataset's shards (labels, splits, symbols), or None if there is none: in
    a local directory, or at the root of its URLs (fetched the way the first shard is)."""
    if not is_url_data(data):
        meta = Path(data) / "dataset.json"
        return json.loads(meta.read_text()) if meta.is_file() else None
    root, urls = resolve_shards(data)
    url = sibling(urls[0], root, "dataset.json")
    raw = fetch_if_present(url, retry)
    try:
        return None if raw is None else json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{url}: dataset.json does not decode: {exc}") from None


# ---------------------------------------------------------------- checking


def _binary(source: str | Path | bytes):
    """A local tar opened for reading, or a fetched shard's bytes as a file."""
    return io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")


def scan_shard(path: str | Path | bytes, name: str | None = None) -> list[tarfile.TarInfo]:
    """The regular members, in order; SampleError('truncated-shard') naming the shard ``name``
    (default: the path) if incomplete. ``path``: a local tar, or a fetched shard's bytes.

    Complete means: every member's data is present and an all-zero end-of-archive
    block follows the last member.
    """
    shard = (str(path) if not isinstance(path, bytes) else "<bytes>") if name is None else name
    try:
        plain = _plain_members(path)
        if plain is not None:
            return plain
        with _binary(path) as f, tarfile.open(fileobj=f, mode="r:*") as tar:
            members = [m for m in tar if m.isreg()]  # walks every header
            tar.fileobj.seek(tar.offset)  # just past the last member's padded data
            marker = tar.fileobj.read(tarfile.BLOCKSIZE)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise SampleError("truncated-shard", f"unreadable tar: {exc}", shard=shard) from None
    if marker != tarfile.NUL * tarfile.BLOCKSIZE:
        raise SampleError("truncated-shard", "tar ends without an end-of-archive block (truncated?)",
                          shard=shard)
    return members


_END_BLOCK = tarfile.NUL * tarfile.BLOCKSIZE
_PLAIN_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)


def _plain_members(path: str | Path | bytes) -> list[tarfile.TarInfo] | None:
    """``scan_shard``'s members read off the headers directly, where every header is a plain file or
    directory and an end-of-archive block follows the last member; None for anything else (a pax,
    long-name, link or sparse header, a ustar prefix, a bad checksum, a short read, a compressed
    tar), which tarfile then scans and names. tarfile's own header parsing was half of reading a
    shard, and extraction scans each shard twice (docs/benchmarks.md)."""
    members, offset = [], 0
    with _binary(path) as f:
        while (header := f.read(tarfile.BLOCKSIZE)) != _END_BLOCK:
            member = _plain_member(header, offset)
            if member is None:
                return None
            if member.type != tarfile.DIRTYPE:
                members.append(member)
            offset = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
            f.seek(offset)
    return members if offset else None  # an empty archive: tarfile's error


def _plain_member(header: bytes, offset: int) -> tarfile.TarInfo | None:
    """The member whose 512-byte header starts at ``offset``, as tarfile would parse it; None unless plain."""
    if len(header) != tarfile.BLOCKSIZE or header[156:157] not in _PLAIN_TYPES or header[345] or header[124] & 0x80:
        return None
    try:
        size, checksum = _octal(header[124:136]), _octal(header[148:156])
    except ValueError:
        return None
    name = header[:100].split(tarfile.NUL, 1)[0].decode(tarfile.ENCODING, "surrogateescape")
    if checksum != 256 + sum(header[:148]) + sum(header[156:]) or name.endswith("/"):
        return None  # a bad (or signed) checksum; a directory written as a file
    member = tarfile.TarInfo(name)
    member.type, member.size, member.offset, member.offset_data = header[156:157], size, offset, offset + tarfile.BLOCKSIZE
    return member


def _octal(field: bytes) -> int:
    """A numeric header field as tarfile reads it (octal digits up to the first NUL, spaces stripped)."""
    return int(field.split(tarfile.NUL, 1)[0].strip() or b"0", 8)


def _member_key(name: str) -> tuple[str | None, str | None]:
    """(key, suffix) as WebDataset groups members; (None, None) for members it skips."""
    if _META.match(name) or ("/" not in name and name.startswith("__") and name.endswith("__")):
        return None, None
    return base_plus_ext(name)


def _wds_key(name: str) -> str:
    return base_plus_ext(name)[0]


def tar_keys(names: list[str]) -> tuple[int, dict[str, str]]:
    """(samples in the tar, {dotted key: the key WebDataset makes of it}) from member names.

    A sample is a ``<key>.json`` member (keyed by the name minus ".json"), or a group of
    other members that has no json. WebDataset cuts names at the first dot, so
    ``k.1.json`` would silently become a member "1.json" of sample "k": such keys are
    found here, from the names, before WebDataset regroups them.
    """
    names = [n for n in names if not posixpath.basename(n).startswith("__")]
    json_keys = {n[: -len(".json")] for n in names if n.endswith(".json")}
    grouped = {_wds_key(n) for n in names if n.endswith(".json")}
    others = {_wds_key(n) for n in names if not n.endswith(".json")} - grouped
    dotted = {k: _wds_key(k + ".json") for k in sorted(json_keys) if "." in posixpath.basename(k)}
    return len(json_keys) + len(others), dotted


def merged_keys(names: list[str], dotted: dict[str, str]) -> set[str]:
    """The keys WebDataset makes of dotted keys that no sample of the tar has itself: samples that
    exist only as the residue of dotted keys, reported under those keys already."""
    genuine = {n[: -len(".json")] for n in names if n.endswith(".json")}
    return set(dotted.values()) - genuine


def sample_keys(names: list[str]) -> list[str]:
    """The keys of a tar's samples as WebDataset groups them, in first-occurrence order, without the
    residue of dotted keys (those samples are bad keys wherever they are)."""
    keys = dict.fromkeys(key for key, _ in map(_member_key, names) if key is not None)
    residue = merged_keys(names, tar_keys(names)[1])
    return [key for key in keys if key not in residue]


def duplicate_keys(names: list[str]) -> list[str]:
    """Keys that WebDataset would yield more than once: one entry per extra occurrence.

    Members group into a sample while consecutive names share a key; a key that comes
    back after another key, or the same ``<key>.<suffix>`` twice, is a duplicate.
    """
    dups, seen, current, suffixes = [], set(), None, set()
    for name in names:
        key, suffix = _member_key(name)
        if key is None:
            continue
        suffix = suffix.lower()
        if key != current:
            if key in seen:
                dups.append(key)
            seen.add(key)
            current, suffixes = key, set()
        elif suffix in suffixes:
            dups.append(key)
        suffixes.add(suffix)
    return dups


# ---------------------------------------------------------------- reading


def _continue_after_duplicate_name(exn: Exception) -> bool:
    """WebDataset handler: go on past a repeated ``<key>.<suffix>`` (already reported), raise the rest."""
    if isinstance(exn, ValueError) and "duplicate file name in tar file" in str(exn):
        return True
    raise exn


def _raw_samples(url: str, members: list[tarfile.TarInfo], name: str, data: bytes | None = None) -> Iterator[dict]:
    """Raw WebDataset dicts of one shard in file order: the scanned members' data, grouped as WebDataset groups.
    ``data``: the shard's bytes, fetched from ``url``; None reads the local file ``url``.

    Members that WebDataset skips (``__meta__`` names, names without a suffix) are not read.
    """
    try:  # tarfile parses the first header only: the rest come from scan_shard
        with _binary(url if data is None else data) as f, tarfile.open(fileobj=f, mode="r:*") as tar:
            files = (dict(fname=m.name, data=_member_data(tar, m), __url__=url, __local_path__=url)
                     for m in members if _member_key(m.name)[0] is not None)
            yield from group_by_keys(files, handler=_continue_after_duplicate_name)
    except (tarfile.TarError, EOFError) as exc:  # the file changed after scan_shard
        raise SampleError("truncated-shard", f"tar read failed: {exc}", shard=name) from None


def _member_data(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """A regular member's bytes, read straight from the archive's (decompressed) stream: an extractfile
    object per member cost ten times the read. A sparse member goes through extractfile."""
    if member.sparse is not None:
        return tar.extractfile(member).read()
    tar.fileobj.seek(member.offset_data)
    data = tar.fileobj.read(member.size)
    if len(data) != member.size:
        raise tarfile.ReadError("unexpected end of data")  # the file changed after scan_shard
    return data


def _report(on_error: ErrorHandler | None, error: SampleError) -> None:
    if on_error is None:
        raise error
    on_error(error)


def _report_bad_names(names: list[str], shard: str, on_error: ErrorHandler | None) -> set[str]:
    """Report the dotted keys (under their real names) and the duplicate keys found from the member names;
    returns the keys whose samples are not to be read: the residue WebDataset makes of dotted keys."""
    _, dotted = tar_keys(names)
    residue = merged_keys(names, dotted)  # reported as the dotted keys, never as what WebDataset made of them
    for key in dotted:
        _report(on_error, SampleError("bad-key", "key contains '.', which WebDataset splits on", key=key, shard=shard))
    for key in duplicate_keys(names):
        if key not in residue:
            _report(on_error, SampleError("duplicate-key", "key occurs more than once in the shard",
                                          key=key, shard=shard))
    return residue


def iter_shard(url: str | Path, *, on_error: ErrorHandler | None = None,
               members: list[tarfile.TarInfo] | None = None, name: str | None = None,
               data: bytes | None = None, retry: Retry = Retry()) -> Iterator[tuple[str, Sample]]:
    """(url, Sample) for one shard; see ``iter_samples``. ``members``: ``scan_shard(url)`` if already done;
    ``name``: the shard's name in errors (``shard_name``; default: the url); ``data``: a URL's bytes if
    already fetched, else a URL is fetched here (``urls.fetch``, retried per ``retry``)."""
    url = str(url)
    name = url if name is None else name
    if data is None and is_url(url):
        data = fetch(url, retry).data
    if members is None:  # truncated-shard is raised whatever on_error says
        members = scan_shard(url if data is None else data, name)
    seen = _report_bad_names([m.name for m in members], name, on_error)  # before anything is yielded
    for raw in _raw_samples(url, members, name, data):
        key = raw.get("__key__")
        if key in seen:  # a later occurrence of a duplicate key, or a dotted key's residue: reported above
            continue
        seen.add(key)
        try:
            sample = parse_sample(raw, shard=name)
        except SampleError as error:
            _report(on_error, error)
            continue
        yield url, sample


def iter_samples(urls: Iterable[str | Path] | str | Path, *,
                 on_error: ErrorHandler | None = None) -> Iterator[tuple[str, Sample]]:
    """Stream (url, Sample) over shards in the given order, single process.

    A bad sample raises SampleError when ``on_error`` is None; otherwise ``on_error``
    gets the error and the sample is skipped (for a duplicate key, the later
    occurrences are skipped and the first is kept). A truncated or unreadable shard
    always raises SampleError('truncated-shard'). A key with a dot is a 'bad-key' under its real
    name (``doc.v1.0001``), never the sample WebDataset merges it into (``doc``).
    """
    if isinstance(urls, (str, Path)):
        urls = [urls]
    for url in urls:
        yield from iter_shard(url, on_error=on_error)
