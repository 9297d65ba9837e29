"""A crash drill: run small TPC-C epochs durably and print each acknowledged epoch.

``python -m dgcc.wal.drill DIR MODE EPOCHS [--seed S] [--batch B] [--checkpoint-every K] ...``
opens (and so recovers) ``DIR``, continues the deterministic request stream after the recovered
epoch up to epoch ``EPOCHS``, and prints ``ack <epoch>`` (flushed) once each epoch is durable
(epochs are pipelined: an epoch's fsync overlaps the next one's execution).
Crash tests run it as a child process and kill it at a crash point (``DGCC_CRASHPOINT``) or with
SIGKILL.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from dgcc.api import TxnRequest
from dgcc.durable import LOG_MODES, Acked, DurableConfig, DurableEngine
from dgcc.storage import Database
from dgcc.workloads.tpcc import TpccWorkload
from dgcc.workloads.tpcc.schema import create_tables

__all__ = ["DRILL_TPCC", "batches", "main", "open_engine", "reference_state"]

DRILL_TPCC = {
    "warehouses": 2,
    "items": 200,
    "customers_per_district": 30,
    "orders_per_district": 30,
}


def batches(seed: int, batch: int, first_epoch: int, epochs: int) -> list[list[TxnRequest]]:
    """The batches of epochs ``first_epoch .. first_epoch + epochs - 1`` of the drill stream."""
    stream = TpccWorkload(**DRILL_TPCC).requests(seed)
    skipped = itertools.islice(stream, (first_epoch - 1) * batch, None)
    return [list(itertools.islice(skipped, batch)) for _ in range(epochs)]


def reference_state(seed: int, batch: int, epochs: int) -> Database:
    """The serial replay of exactly epochs 1..``epochs`` from the initial state."""
    from dgcc.protocols.serial import SerialProtocol

    workload = TpccWorkload(**DRILL_TPCC)
    db = workload.build(seed)
    serial = SerialProtocol(db, workload.registry())
    for requests in batches(seed, batch, 1, epochs):
        serial.run_batch(requests)
    return db


def open_engine(directory: Path, mode: str, seed: int, **options: object) -> DurableEngine:
    workload = TpccWorkload(**DRILL_TPCC)
    config = DurableConfig(
        directory=directory,
        mode=mode,
        workload=TpccWorkload.name,
        workload_options=DRILL_TPCC,
        **options,  # type: ignore[arg-type]
    )
    initial = lambda: workload.build(seed)  # noqa: E731
    return DurableEngine(
        config,
        workload.registry(),
        create_tables,
        initial,
        workload.partition_of,
        workload.route_keys,
    )


def _print_acks(acked: list[Acked]) -> None:
    for done in acked:
        sys.stdout.write(f"ack {done.epoch}\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dgcc.wal.drill")
    parser.add_argument("directory", type=Path)
    parser.add_argument("mode", choices=LOG_MODES)
    parser.add_argument("epochs", type=int)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--no-fork", action="store_true")
    parser.add_argument("--partitions", type=int, default=0)
    parser.add_argument("--recovery-workers", type=int, default=1)
    args = parser.parse_args(argv)
    engine = open_engine(
        args.directory,
        args.mode,
        args.seed,
        checkpoint_every_epochs=args.checkpoint_every,
        fork_checkpoint=not args.no_fork,
        partitions=args.partitions,
        recovery_workers=args.recovery_workers,
    )
    sys.stdout.write(f"recovered {engine.epoch}\n")
    sys.stdout.flush()
    left = max(0, args.epochs - engine.epoch)
    for requests in batches(args.seed, args.batch, engine.epoch + 1, left):
        _print_acks(engine.submit(requests))  # pipelined: epoch e's fsync overlaps e + 1
    _print_acks(engine.flush())
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
