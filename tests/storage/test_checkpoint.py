"""Checkpoint: atomic save with the previous one kept, validation magic → version → CRC → sanity."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import msgpack
import pytest
from delayd.storage import checkpoint as ckpt
from delayd.storage.checkpoint import CHECKPOINT_MAGIC, CHECKPOINT_VERSION, HEADER, Checkpoint
from delayd.storage.errors import BadMagic, ChecksumMismatch, Insane, UnsupportedVersion


def full() -> Checkpoint:
    return Checkpoint(commit_indexed=1000, commit_end=2000, timerlog_end=520, read_time_ms=1_700_000_000_000,
                      next_seq=77, ready_ends={"a": 3, "b/c": 9}, counters={"totals": {"produced": 5}},
                      schedule=zlib.compress(b"\0" * 64), far_schedule={472222: 3, 472223: 1},
                      groups={"a/g": {"floor": 2, "acks": [4, 5]}}, created_ms=1_700_000_000_123)


def test_every_field_round_trips(tmp_path: Path) -> None:
    cp = full()
    ckpt.save(tmp_path / "checkpoint", cp)
    assert ckpt.load(tmp_path / "checkpoint") == cp
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_header_fields_at_their_offsets(tmp_path: Path) -> None:
    ckpt.save(tmp_path / "checkpoint", full())
    data = (tmp_path / "checkpoint").read_bytes()
    assert data[:4] == b"DLCP" and struct.unpack_from("<I", data, 0)[0] == CHECKPOINT_MAGIC
    assert struct.unpack_from("<H", data, 4)[0] == CHECKPOINT_VERSION
    body_len, crc = struct.unpack_from("<II", data, 8)
    assert body_len == len(data) - HEADER.size == len(data) - 16
    assert crc == zlib.crc32(data[16:])
    assert msgpack.unpackb(data[16:], strict_map_key=False)["next_seq"] == 77


def test_the_previous_checkpoint_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "checkpoint"
    ckpt.save(p, Checkpoint(next_seq=5))
    ckpt.save(p, Checkpoint(next_seq=9))
    assert ckpt.previous(p) == tmp_path / "checkpoint.prev"
    assert ckpt.load(p).next_seq == 9 and ckpt.load(ckpt.previous(p)).next_seq == 5


def rewrite(p: Path, *, magic: int = CHECKPOINT_MAGIC, version: int = CHECKPOINT_VERSION,
            body: bytes | None = None, crc: int | None = None) -> None:
    data = p.read_bytes()
    body = data[16:] if body is None else body
    p.write_bytes(HEADER.pack(magic, version, 0, len(body), zlib.crc32(body) if crc is None else crc) + body)


def test_validation_order(tmp_path: Path) -> None:
    p = tmp_path / "checkpoint"
    ckpt.save(p, full())
    rewrite(p, magic=1, version=2, crc=3)
    with pytest.raises(BadMagic):
        ckpt.load(p)
    ckpt.save(p, full())
    rewrite(p, version=2, crc=3)
    with pytest.raises(UnsupportedVersion):
        ckpt.load(p)
    ckpt.save(p, full())
    rewrite(p, crc=3)
    with pytest.raises(ChecksumMismatch):
        ckpt.load(p)
    ckpt.save(p, full())
    p.write_bytes(p.read_bytes()[:-1])  # body cut short
    with pytest.raises(ChecksumMismatch):
        ckpt.load(p)
    p.write_bytes(b"DLCP")
    with pytest.raises(BadMagic):
        ckpt.load(p)
    os.unlink(p)
    with pytest.raises(FileNotFoundError):
        ckpt.load(p)


@pytest.mark.parametrize("fields", [
    {"commit_indexed": 10, "commit_end": 5},  # indexed past the end
    {"next_seq": -1},
    {"timerlog_end": -52},
    {"no_such_field": 1},
])
def test_sanity(tmp_path: Path, fields: dict[str, int]) -> None:
    p = tmp_path / "checkpoint"
    ckpt.save(p, Checkpoint())
    body = msgpack.unpackb(p.read_bytes()[16:], strict_map_key=False)
    body.update(fields)
    rewrite(p, body=msgpack.packb(body))
    with pytest.raises(Insane):
        ckpt.load(p)


def test_a_body_that_is_not_a_map_is_insane(tmp_path: Path) -> None:
    p = tmp_path / "checkpoint"
    ckpt.save(p, Checkpoint())
    rewrite(p, body=b"\xc1")  # msgpack's never-used byte
    with pytest.raises(Insane):
        ckpt.load(p)
