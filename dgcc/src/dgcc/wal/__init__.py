"""Durability for dgcc: write-ahead logs, checkpoints and recovery (dependency logging, after
DistDGCC; see docs/architecture.md).

One log block per node per epoch (group commit), in one of three schemes: ``command`` (inputs,
serial replay), ``value`` (after-images) and ``dependency`` (inputs plus the epoch's dependency
graph and logic-abort decisions, replayed by in-degree). ``none`` logs nothing. A DistDGCC
node logs its own block per epoch (``node_log``: its inputs and the values it received), so it
recovers alone, and rejoins its running peers (``rejoin``); a Calvin node logs the same block
(input logging). The 2PC baselines keep a redo log with prepare, decision and commit records
(``twopc_log``). ``trials`` and ``cluster_trials`` are the crash trials behind ``dgcc drill``.
"""

from dgcc.wal.format import Block, BlockKind, ScanResult, WalCorrupt, encode_block, scan_bytes

__all__ = ["Block", "BlockKind", "ScanResult", "WalCorrupt", "encode_block", "scan_bytes"]
