"""Span checksums (issue #24 item 8): a data file larger than one span is verified as one
SHA-256 per span, the spans hashed on several cores at once; a file of one span keeps the
single whole-file `sha256` older checkpoints have, and both verify the same way."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpuvigil.training import manifest
from gpuvigil.training import storage as storage_mod
from gpuvigil.training.storage import Digest, LocalStorage
from gpuvigil.training.writer import write_file


def test_digest_spans_match_hashing_each_span_whatever_the_pieces() -> None:
    data = os.urandom(10_000)
    for cut in (1, 7, 999, 1000, 1001, 4096, 10_000):
        d = Digest(span=1000)
        for at in range(0, len(data), cut):
            d.update(memoryview(data)[at : at + cut])
        want = [hashlib.sha256(data[i : i + 1000]).hexdigest() for i in range(0, 10_000, 1000)]
        assert d.entry() == {"size": 10_000, "sha256_spans": want, "span_bytes": 1000}
    short = Digest(span=1000)
    short.update(data[:1500])
    assert short.entry()["sha256_spans"][1] == hashlib.sha256(data[1000:1500]).hexdigest()


def test_one_span_or_less_is_the_whole_file_sha256() -> None:
    for n in (0, 1, 1000):
        d = Digest(span=1000)
        d.update(b"x" * n)
        assert d.entry() == {"size": n, "sha256": hashlib.sha256(b"x" * n).hexdigest()}


@pytest.fixture
def small_spans(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(storage_mod, "SPAN", 4096)
    return 4096


def test_a_flipped_byte_names_its_span_and_a_good_file_passes(
    tmp_path: Path, small_spans: int
) -> None:
    st = LocalStorage(str(tmp_path))
    data = os.urandom(10 * small_spans + 5)
    entry = write_file(st, "f/__0_0.distcp", [memoryview(data)])
    assert len(entry["sha256_spans"]) == 11 and entry["span_bytes"] == small_spans
    for workers in (1, 4):
        assert (
            st.sha256_spans("f/__0_0.distcp", small_spans, workers=workers) == entry["sha256_spans"]
        )
    assert manifest.check_file(st, "f", "__0_0.distcp", entry, checksums=True) == ""
    path = tmp_path / "f" / "__0_0.distcp"
    raw = bytearray(path.read_bytes())
    raw[3 * small_spans + 17] ^= 1
    path.write_bytes(bytes(raw))
    why = manifest.check_file(st, "f", "__0_0.distcp", entry, checksums=True)
    assert "fails its SHA-256 check at bytes 12288-16384" in why
    assert manifest.check_file(st, "f", "__0_0.distcp", entry, checksums=False) == ""


def test_malformed_span_entries_are_damage_never_an_exception(
    tmp_path: Path, small_spans: int
) -> None:
    st = LocalStorage(str(tmp_path))
    data = os.urandom(3 * small_spans)
    entry = write_file(st, "f/d", [memoryview(data)])
    for bad in (
        {**entry, "span_bytes": 0},
        {**entry, "span_bytes": "4096"},
        {**entry, "sha256_spans": "abc"},
        {**entry, "sha256_spans": entry["sha256_spans"][:2]},
        {**entry, "sha256_spans": [*entry["sha256_spans"], "0" * 64]},
    ):
        assert manifest.check_file(st, "f", "d", bad, checksums=True) != ""
