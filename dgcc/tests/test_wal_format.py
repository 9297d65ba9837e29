"""WAL block format and group-commit writer.

Goal: blocks round-trip, and any torn or bit-flipped tail is detected and dropped from the first
damaged block on, with a message naming the file, the offset and the reason. Method: hypothesis
over payloads, cut points and flipped bits; a real directory for the writer.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgcc.wal.format import (
    HEADER_BYTES,
    BlockKind,
    WalCorrupt,
    decode_payload,
    encode_block,
    scan_bytes,
)
from dgcc.wal.writer import WalWriter, list_segments

payloads = st.lists(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=20) | st.binary(max_size=40),
        lambda children: st.lists(children, max_size=4) | st.tuples(children, children),
        max_leaves=10,
    ),
    min_size=1,
    max_size=6,
)


def _log(items: list[object]) -> tuple[bytes, list[int]]:
    data, starts = b"", []
    for epoch, item in enumerate(items, 1):
        starts.append(len(data))
        data += encode_block(BlockKind.COMMAND, epoch, item)
    return data, starts


@settings(max_examples=60, deadline=None)
@given(payloads)
def test_blocks_round_trip(items: list[object]) -> None:
    data, starts = _log(items)
    scan = scan_bytes(data, "seg.log")
    assert scan.problem is None
    assert scan.valid_bytes == len(data)
    assert [decode_payload(block) for block in scan.blocks] == items
    assert [block.epoch for block in scan.blocks] == list(range(1, len(items) + 1))
    assert [block.offset for block in scan.blocks] == starts


@settings(max_examples=80, deadline=None)
@given(payloads, st.data())
def test_torn_tail_is_dropped(items: list[object], data_strategy: st.DataObject) -> None:
    data, starts = _log(items)
    cut = data_strategy.draw(st.integers(0, len(data) - 1))
    scan = scan_bytes(data[:cut], "seg.log")
    intact = sum(
        1 for start, end in zip(starts, [*starts[1:], len(data)], strict=True) if end <= cut
    )
    assert len(scan.blocks) == intact
    assert scan.valid_bytes == (starts[intact] if intact < len(starts) else len(data))
    if cut == scan.valid_bytes:
        assert scan.problem is None
    else:
        assert scan.problem is not None
        assert f"seg.log: dropping {cut - scan.valid_bytes} bytes from offset " in scan.problem
        assert "torn" in scan.problem


@settings(max_examples=80, deadline=None)
@given(payloads, st.data())
def test_bit_flip_is_detected(items: list[object], data_strategy: st.DataObject) -> None:
    data, starts = _log(items)
    position = data_strategy.draw(st.integers(0, len(data) - 1))
    bit = data_strategy.draw(st.integers(0, 7))
    damaged = bytearray(data)
    damaged[position] ^= 1 << bit
    scan = scan_bytes(bytes(damaged), "seg.log")
    hit = max(index for index, start in enumerate(starts) if start <= position)
    # Every block before the damaged one survives; the damaged one and the rest are dropped
    # (a flip in a length field may read as torn, anything else as a checksum/magic failure).
    assert len(scan.blocks) == hit
    assert scan.valid_bytes == starts[hit]
    assert scan.problem is not None
    assert f"from offset {starts[hit]}:" in scan.problem
    # Only damage to the last block can be a torn tail; before it, the next block is intact.
    if hit == len(starts) - 1:
        assert scan.intact_after is None
        scan.refuse_damage()
    else:
        assert scan.intact_after == starts[hit + 1]
        with pytest.raises(WalCorrupt, match=f"offset {starts[hit + 1]}.*no crash leaves"):
            scan.refuse_damage()


def _checksummed(block: bytearray) -> bytes:
    """``block`` with its CRC made right again (a whole block another writer could make)."""
    crc = zlib.crc32(block[HEADER_BYTES:], zlib.crc32(block[: HEADER_BYTES - 4]))
    return bytes(block[: HEADER_BYTES - 4]) + struct.pack("<I", crc) + bytes(block[HEADER_BYTES:])


@pytest.mark.parametrize(
    ("field", "value", "reason"), [(4, 9, "unknown version 9"), (5, 99, "unknown block kind 99")]
)
def test_a_whole_block_of_another_version_or_kind_is_damage_not_a_tail(field, value, reason):
    # A torn write leaves a prefix of one of our own blocks, never a whole checksummed block
    # of a version or kind this dgcc does not know: dropping it (and the rest) would lose
    # acknowledged epochs that a newer dgcc wrote.
    first = encode_block(BlockKind.VALUE, 1, {"images": []})
    foreign = bytearray(encode_block(BlockKind.VALUE, 2, {"images": []}))
    foreign[field] = value
    scan = scan_bytes(first + _checksummed(foreign), "x")
    assert [block.epoch for block in scan.blocks] == [1]
    assert reason in (scan.problem or "")
    with pytest.raises(WalCorrupt, match="written by another dgcc version"):
        scan.refuse_damage()


def test_a_damaged_block_with_the_next_one_begun_after_it_is_damage_not_a_tail() -> None:
    # Block e + 1 is written only once block e is synced: a whole block e whose checksum fails
    # with e + 1 begun after it (even torn) was acknowledged, then damaged.
    blocks = [encode_block(BlockKind.COMMAND, epoch, "x" * 40) for epoch in (1, 2, 3)]
    damaged = bytearray(blocks[1])
    damaged[-1] ^= 1
    data = blocks[0] + bytes(damaged) + blocks[2][:10]
    scan = scan_bytes(data, "x")
    assert [block.epoch for block in scan.blocks] == [1]
    assert scan.intact_after == len(blocks[0]) + len(blocks[1])
    with pytest.raises(WalCorrupt, match="next block was begun after it"):
        scan.refuse_damage()
    alone = scan_bytes(blocks[0] + bytes(damaged), "x")  # nothing after it: may be torn
    assert alone.intact_after is None
    alone.refuse_damage()


def test_unknown_kind_and_version_are_reported() -> None:
    short = encode_block(BlockKind.VALUE, 7, None)[: HEADER_BYTES - 1]
    torn = f"torn header ({HEADER_BYTES - 1} of {HEADER_BYTES} bytes)"
    expected = f"x: dropping {HEADER_BYTES - 1} bytes from offset 0: {torn}"
    assert scan_bytes(short, "x").problem == expected


def test_epochs_must_increase() -> None:
    data = encode_block(BlockKind.COMMAND, 2, 1) + encode_block(BlockKind.COMMAND, 2, 1)
    scan = scan_bytes(data, "x")
    assert len(scan.blocks) == 1
    assert "epoch 2 after epoch 2" in (scan.problem or "")
    assert scan.intact_after == len(data) // 2  # an intact block out of order: no torn tail


def test_encode_rejects_bad_epoch() -> None:
    with pytest.raises(ValueError, match="epoch -1"):
        encode_block(BlockKind.COMMAND, -1, None)


def test_writer_appends_rolls_and_truncates(tmp_path: Path) -> None:
    writer = WalWriter(tmp_path, 1)
    for epoch in (1, 2):
        writer.append(epoch, encode_block(BlockKind.COMMAND, epoch, epoch))
    writer.roll(3)
    writer.append(3, encode_block(BlockKind.COMMAND, 3, 3))
    assert writer.fsyncs == 3
    assert [first for first, _ in list_segments(tmp_path)] == [1, 3]
    assert writer.truncate_before(3) == 1
    assert [first for first, _ in list_segments(tmp_path)] == [3]
    writer.close()
    reopened = WalWriter(tmp_path, 4)  # appends to the newest segment
    reopened.append(4, encode_block(BlockKind.COMMAND, 4, 4))
    reopened.close()
    scan = scan_bytes((tmp_path / "wal-000000000003.log").read_bytes())
    assert [decode_payload(block) for block in scan.blocks] == [3, 4]


def test_short_writes_are_continued_and_a_failed_write_fails_the_log_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``os.write`` may write part of what it is given (a full disk, a signal): the writer
    writes the rest. A write that fails reaches ``on_failed`` at once, ``wait``, and every
    later ``start``: the file may end in part of a block, which no block may follow."""
    import errno
    import os

    import dgcc.wal.writer as writer_module

    budget, real_write = {"bytes": 10**9}, os.write

    def stingy_write(fd: int, data) -> int:  # at most 7 bytes a call, up to the budget
        if budget["bytes"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        count = real_write(fd, bytes(data[: min(7, budget["bytes"])]))
        budget["bytes"] -= count
        return count

    monkeypatch.setattr(writer_module.os, "write", stingy_write)
    writer = WalWriter(tmp_path, 1)
    durable, failed = [], []
    for epoch in (1, 2):
        writer.start(epoch, encode_block(BlockKind.COMMAND, epoch, "x" * 50), durable.append)
        writer.wait()
    assert durable == [1, 2] and writer.bytes_written > 100
    budget["bytes"] = 30  # the disk fills up in the middle of epoch 3's block
    writer.start(3, encode_block(BlockKind.COMMAND, 3, "y" * 50), durable.append, failed.append)
    with pytest.raises(OSError, match="No space"):
        writer.wait()
    assert durable == [1, 2] and [error.errno for error in failed] == [errno.ENOSPC]
    budget["bytes"] = 10**9  # space again: the torn block still ends the file
    with pytest.raises(OSError, match="failed an earlier write"):
        writer.start(4, encode_block(BlockKind.COMMAND, 4, 4))
    monkeypatch.undo()
    scan = scan_bytes((tmp_path / "wal-000000000001.log").read_bytes())
    assert [decode_payload(block) for block in scan.blocks] == ["x" * 50, "x" * 50]
    assert scan.problem is not None and scan.intact_after is None  # a torn tail: dropped


def test_writer_rejects_out_of_order_epoch(tmp_path: Path) -> None:
    writer = WalWriter(tmp_path, 1)
    with pytest.raises(AssertionError, match="expected 1"):
        writer.append(2, encode_block(BlockKind.COMMAND, 2, 2))
    writer.close()


def test_cutting_past_an_empty_rolled_segment_reaches_the_blocks_before_it(tmp_path) -> None:
    """A node rolls to an empty segment right after recording a checkpoint epoch; a restart
    to an earlier epoch must still cut the blocks before that segment (it stopped at the
    empty one, and the next restart found the log jumping back)."""
    from dgcc.wal.format import BlockKind, encode_block
    from dgcc.wal.recovery import cut_after, read_log
    from dgcc.wal.writer import WalWriter, list_segments

    writer = WalWriter(tmp_path, 1)
    for epoch in range(1, 10):
        writer.append(epoch, encode_block(BlockKind.NODE, epoch, {"x": epoch}))
    writer.roll(10)
    writer.close()
    cut_after(tmp_path, 7)
    assert [path.name for _, path in list_segments(tmp_path)] == ["wal-000000000001.log"]
    writer = WalWriter(tmp_path, 8)
    writer.append(8, encode_block(BlockKind.NODE, 8, {"x": 8}))
    writer.close()
    assert [block.epoch for block in read_log(tmp_path, 0)[0]] == list(range(1, 9))
