"""The on-disk block: one per node per epoch in a log segment, and one per checkpoint snapshot.

Layout, little-endian: magic ``DGWL`` (4 bytes), version (u8), kind (u8), epoch (u64), payload
length (u32), CRC-32 (u32) over the header's first 18 bytes and the payload; then the payload
(a pickle of plain data that we wrote ourselves). ``scan_bytes`` reads blocks until the first
one that is torn or corrupt and reports the file, the offset and the reason. Segments are only
ever appended to (``O_APPEND``, created fresh), and a block is written only once the one
before it is synced, so a crash can tear only the last write: a damaged block with nothing
after it is an unacknowledged tail (an epoch is acknowledged only after its fsync) that
recovery may drop. Damage no crash leaves (``ScanResult.intact_after``), where dropping would
lose acknowledged epochs: an intact block after the damaged one; a whole block whose checksum
fails with the next block begun after it (so it was synced); a whole, checksummed block of an
unknown version or kind (a newer dgcc's, not a torn write); a block out of epoch order.
"""

from __future__ import annotations

import enum
import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from dgcc.errors import DgccError

__all__ = [
    "HEADER_BYTES",
    "Block",
    "BlockKind",
    "ScanResult",
    "WalCorrupt",
    "decode_payload",
    "encode_block",
    "scan_bytes",
]

MAGIC = b"DGWL"
VERSION = 1
_HEADER = struct.Struct("<4sBBQII")
HEADER_BYTES = _HEADER.size  # 22
_CRC_COVERED = HEADER_BYTES - 4
PAYLOAD_BYTES_MAX = 1 << 31


class WalCorrupt(DgccError):
    """A log or checkpoint is damaged where no crash could have left it (not a torn tail)."""


class BlockKind(enum.IntEnum):
    COMMAND = 1
    VALUE = 2
    DEPENDENCY = 3
    SNAPSHOT = 4
    NODE = 5  # a DistDGCC node's epoch: its inputs and the values it received
    TWOPC = 6  # a 2PC node's group-committed records (``twopc_log``)


@dataclass(frozen=True, slots=True)
class Block:
    kind: BlockKind
    epoch: int
    payload: bytes
    offset: int  # where the block starts in its file


@dataclass(frozen=True, slots=True)
class ScanResult:
    """The intact blocks of a file, where they end, and why the rest (if any) was dropped."""

    blocks: list[Block]
    valid_bytes: int
    problem: str | None  # None: the file ends exactly after its last block
    # With a problem that is not a torn tail: the offset that shows it (an intact block past
    # it, or the damaged block itself; ``damage`` says what, ``proof`` why it is not torn).
    # None: a torn tail.
    intact_after: int | None = None
    damage: str = ""
    proof: str = ""

    def refuse_damage(self) -> None:
        """Raise ``WalCorrupt`` when the problem is not a torn tail (an intact block follows).

        Raises:
            WalCorrupt: the damage is followed by an intact block; nothing is changed on disk.
        """
        if self.problem is not None and self.intact_after is not None:
            raise WalCorrupt(
                f"{self.damage}, and {self.proof}: damage no crash leaves, not a torn tail "
                "(nothing was changed on disk)"
            )


def encode_block(kind: BlockKind, epoch: int, payload_obj: Any) -> bytes:
    """Frame ``payload_obj`` (pickled) as one checksummed block for ``epoch``."""
    payload = pickle.dumps(payload_obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) >= PAYLOAD_BYTES_MAX:
        raise ValueError(f"epoch {epoch}: payload of {len(payload)} bytes is too large")
    if not 0 <= epoch < 1 << 64:
        raise ValueError(f"epoch {epoch!r} out of range for the block header")
    head = _HEADER.pack(MAGIC, VERSION, int(kind), epoch, len(payload), 0)[:_CRC_COVERED]
    crc = zlib.crc32(payload, zlib.crc32(head))
    block = head + struct.pack("<I", crc) + payload
    assert _check_crc(block, 0, len(payload)), "fresh block fails its own checksum"
    return block


def decode_payload(block: Block) -> Any:
    """The block's payload object.

    Raises:
        WalCorrupt: it does not unpickle (a class it names is gone, say): one line naming the
            block, not the unpickler's traceback.
    """
    try:
        return pickle.loads(block.payload)
    except (MemoryError, RecursionError):  # this machine's limits, not damage to the block
        raise
    except Exception as error:
        raise WalCorrupt(
            f"the epoch {block.epoch} block at offset {block.offset} does not decode: "
            f"{type(error).__name__}: {error}"
        ) from None


def _check_crc(data: bytes | memoryview, offset: int, length: int) -> bool:
    stored = struct.unpack_from("<I", data, offset + _CRC_COVERED)[0]
    crc = zlib.crc32(data[offset : offset + _CRC_COVERED])
    crc = zlib.crc32(data[offset + HEADER_BYTES : offset + HEADER_BYTES + length], crc)
    return stored == crc


def scan_bytes(data: bytes, name: str = "<bytes>") -> ScanResult:
    """Decode consecutive blocks of ``data``; stop at the first torn or damaged one.

    Args:
        data: a whole log segment or snapshot file.
        name: the file's name, for the ``problem`` message.
    """
    view = memoryview(data)
    blocks: list[Block] = []
    offset = 0
    while offset < len(data):
        reason, length, kind, epoch = _check_block(view, offset)
        intact_after, proof = None, ""
        if reason is not None:
            intact_after, proof = _not_torn(data, view, offset, reason)
        elif blocks and epoch <= blocks[-1].epoch:
            reason = f"epoch {epoch} after epoch {blocks[-1].epoch}"
            intact_after, proof = offset, "the block itself is intact"
        if reason is not None:
            problem = f"{name}: dropping {len(data) - offset} bytes from offset {offset}: {reason}"
            damage = f"{name}: damaged block at offset {offset} ({reason})"
            return ScanResult(blocks, offset, problem, intact_after, damage, proof)
        start = offset + HEADER_BYTES
        blocks.append(Block(BlockKind(kind), epoch, bytes(view[start : start + length]), offset))
        offset = start + length
    return ScanResult(blocks, offset, None)


def _not_torn(data: bytes, view: memoryview, offset: int, reason: str) -> tuple[int | None, str]:
    """(the offset that shows the unusable block at ``offset`` is no torn tail, and why), or
    (None, "") when it may be one."""
    if reason.startswith((_FOREIGN_VERSION, _FOREIGN_KIND)):
        return offset, "it is whole and checksummed: written by another dgcc version"
    if reason.startswith(_CHECKSUM):
        length = _HEADER.unpack_from(view, offset)[4]
        after = offset + HEADER_BYTES + length
        if data[after : after + len(MAGIC)] == MAGIC:
            return after, f"the next block was begun after it (offset {after}), once it was synced"
    found = _intact_after(data, view, offset)
    return found, f"an intact block follows at offset {found}"


def _intact_after(data: bytes, view: memoryview, offset: int) -> int | None:
    """Where the first intact block starting past ``offset`` lies, if any."""
    found = data.find(MAGIC, offset + 1)
    while found != -1:
        if _check_block(view, found)[0] is None:
            return found
        found = data.find(MAGIC, found + 1)
    return None


def _check_block(view: memoryview, offset: int) -> tuple[str | None, int, int, int]:
    """(reason the block at ``offset`` is unusable or None, payload length, kind, epoch)."""
    left = len(view) - offset
    if left < HEADER_BYTES:
        return f"torn header ({left} of {HEADER_BYTES} bytes)", 0, 0, 0
    magic, version, kind, epoch, length, _ = _HEADER.unpack_from(view, offset)
    if magic != MAGIC:
        return f"bad magic {bytes(magic)!r}", 0, 0, 0
    if left - HEADER_BYTES < length:
        return f"torn payload ({left - HEADER_BYTES} of {length} bytes)", 0, 0, 0
    if not _check_crc(view, offset, length):
        return f"{_CHECKSUM} in epoch {epoch} block", 0, 0, 0
    if version != VERSION:
        return f"{_FOREIGN_VERSION} {version}", 0, 0, 0
    if kind not in BlockKind._value2member_map_:
        return f"{_FOREIGN_KIND} {kind}", 0, 0, 0
    return None, length, kind, epoch


_CHECKSUM, _FOREIGN_VERSION, _FOREIGN_KIND = (
    "checksum mismatch",
    "unknown version",
    "unknown block kind",
)
