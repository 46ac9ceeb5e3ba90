"""``manifest.json`` of a prepared dataset: what went in, what each stage did, where the shards
are, and a fingerprint over all of it (shard and tokenizer hashes included), so a checkpoint can
refuse a dataset that is not the one it was trained on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"  # beside the manifest of every prepared dataset
FORMAT = "megatron-lgs/webdataset-tokens"
FORMAT_VERSION = 1
# Inside a shard, a document's tokens are the member ``<key>.tokens.i32``: raw little-endian
# int32, so the index can point straight at them.
TOKENS_EXT = "tokens.i32"
TOKEN_DTYPE = np.dtype("<i4")
INDEX_DTYPE = np.dtype([("offset", "<i8"), ("tokens", "<i8"), ("domain", "<i4")])
_HASH_BLOCK = 1 << 20


class DatasetError(Exception):
    """A prepared dataset directory that is missing, incomplete or inconsistent."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def json_sha256(record: dict[str, Any]) -> str:
    """sha256 of a JSON-able record, its keys sorted: the same record, the same digest."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()


def fingerprint(manifest: dict[str, Any]) -> str:
    return json_sha256({k: v for k, v in manifest.items() if k != "fingerprint"})


def content_fingerprint(manifest: dict[str, Any]) -> str:
    """What a dataset holds, for a checkpoint to compare: the manifest but where its input lay
    (`sources`, as given to prepare). The same documents prepared from another folder (the
    embedded corpus goes through a fresh temporary one each time it is built) are the same
    dataset; the shards' and the tokenizer's hashes carry the content."""
    return json_sha256({k: v for k, v in manifest.items() if k not in ("fingerprint", "sources")})


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    full = {**manifest, "format": FORMAT, "format_version": FORMAT_VERSION}
    full["fingerprint"] = fingerprint(full)
    (out_dir / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n",
                                    encoding="utf-8")
    return full


def load_manifest(dataset_dir: str | Path, verify_shards: bool = False) -> dict[str, Any]:
    """The manifest, after checking that every shard and index it names is there and agrees
    with it (sizes, document and token counts, offsets inside the tar). ``verify_shards`` also
    re-hashes the shards (reads every byte)."""
    root = Path(dataset_dir)
    path = root / MANIFEST
    if not path.is_file():
        raise DatasetError(f"{root}: no {MANIFEST}; is this a `python -m data_pipeline prepare` "
                           f"output directory?")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{path}: format {manifest.get('format')!r} version "
                           f"{manifest.get('format_version')!r}, expected {FORMAT!r} version "
                           f"{FORMAT_VERSION}")
    if manifest.get("fingerprint") != fingerprint(manifest):
        raise DatasetError(f"{path}: fingerprint does not match its contents (edited by hand?)")
    for shard in manifest["shards"]:
        _check_shard(root, shard, len(manifest["domains"]), verify_shards)
    return manifest


def load_index(root: Path, shard: dict[str, Any]) -> np.ndarray:
    path = root / shard["index"]
    try:
        index = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable index ({exc})") from None
    if index.dtype != INDEX_DTYPE or index.ndim != 1:
        raise DatasetError(f"{path}: index has dtype {index.dtype}{index.shape}, "
                           f"expected {INDEX_DTYPE}")
    return index


def _check_shard(root: Path, shard: dict[str, Any], n_domains: int, verify: bool) -> None:
    tar = root / shard["tar"]
    if not tar.is_file():
        raise DatasetError(f"{tar}: shard named in {MANIFEST} is missing")
    size = tar.stat().st_size
    if size != shard["bytes"]:
        raise DatasetError(f"{tar}: {size} bytes, {MANIFEST} says {shard['bytes']} "
                           f"(truncated or replaced)")
    index = load_index(root, shard)
    if len(index) != shard["documents"] or int(index["tokens"].sum()) != shard["tokens"]:
        raise DatasetError(f"{root / shard['index']}: {len(index)} documents / "
                           f"{int(index['tokens'].sum())} tokens, {MANIFEST} says "
                           f"{shard['documents']} / {shard['tokens']}")
    ends = index["offset"] + index["tokens"] * TOKEN_DTYPE.itemsize
    if len(index) and (index["offset"].min() < 0 or ends.max() > size
                       or index["domain"].min() < 0 or index["domain"].max() >= n_domains):
        raise DatasetError(f"{root / shard['index']}: entries point outside {tar.name} or name "
                           f"unknown domains")
    if verify and file_sha256(tar) != shard["sha256"]:
        raise DatasetError(f"{tar}: sha256 differs from {MANIFEST}")
