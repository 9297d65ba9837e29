"""``dgcc drill``: repeated randomized crash trials of the durable engine or a logging cluster.

``dgcc drill --trials N [--seed S] [--cluster [--rejoin]] [--dir DIR]`` runs N seeded trials
(the same ones the crash tests run a few of): real child processes killed by SIGKILL at a random
moment or at each named crash point in turn, then recovered and checked against the serial
replay of exactly the durable epochs. With ``--rejoin``, one node of a running 2- or 3-node
cluster is killed and only it restarts (every other trial, its first restart dies half-way
through its log replay): it catches up and the cluster goes on. Prints a progress
bar, then one table row per kind of death; exits 1 at the first broken promise, with its message.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from dgcc.errors import ConfigError, make_dir
from dgcc.wal import cluster_trials, trials
from dgcc.wal.crashpoints import CRASHPOINTS

__all__ = ["command", "register"]

TRIALS_MAX = 100_000
# the in-process engine's own log and checkpoint points (recovery ones are armed mid-recovery;
# twopc ones live in the 2PC cluster nodes)
SINGLE_POINTS = tuple(point for point in CRASHPOINTS if point.startswith(("wal.", "ckpt.")))
CLUSTER_POINTS = ("wal.mid_write", "wal.before_fsync", "wal.after_fsync")


def register(commands: argparse._SubParsersAction) -> None:
    drill = commands.add_parser("drill", help="randomized crash-and-recover trials")
    drill.add_argument("--trials", type=int, default=20, help="how many trials")
    drill.add_argument("--seed", type=int, default=1, help="one seed replays the whole drill")
    drill.add_argument("--cluster", action="store_true", help="a 2-node logging cluster")
    drill.add_argument(
        "--rejoin",
        action="store_true",
        help="with --cluster: kill one node, restart only it while the others keep running",
    )
    drill.add_argument("--dir", type=Path, help="keep the trial directories here")
    drill.set_defaults(check_invariants=False)


def _one(args: argparse.Namespace, root: Path, number: int, rng: random.Random) -> str:
    """Run trial ``number``; returns how it died (raises DrillFailure on a broken promise)."""
    directory = root / f"trial{number}"
    if args.rejoin:  # every third trial: 3 nodes (a peer may miss the victim's inputs)
        nodes = 3 if number % 3 == 2 else 2
        options = dict(cluster_trials.ClusterDrill().options, warehouses=nodes)
        drill = cluster_trials.ClusterDrill(nodes=nodes, seed=args.seed, options=options)
        trial = cluster_trials.rejoin_trial(directory, rng, drill, crash_recovery=number % 2 == 1)
        crashed = " + crash in recovery" if trial.crashed_recovery else ""
        return f"sigkill one of {nodes} nodes, rejoin{crashed}"
    if args.cluster:  # every third trial also takes forked checkpoints as it runs
        every = 2 if number % 3 == 1 else 0
        drill = cluster_trials.ClusterDrill(seed=args.seed, checkpoint_every_epochs=every)
        if number % 4 == 3:  # every fourth trial: the next log-write crash point
            point = CLUSTER_POINTS[(number // 4) % len(CLUSTER_POINTS)]
            return cluster_trials.crash_point_trial(directory, point, drill).how
        trial = cluster_trials.random_trial(directory, rng, drill, crash_recovery=number % 2 == 0)
        return "sigkill" + (" + crash in recovery" if trial.crashed_recovery else "")
    if number % 2:  # every other trial: the next crash point
        point = SINGLE_POINTS[(number // 2) % len(SINGLE_POINTS)]
        return trials.crash_point_trial(directory, rng, point, seed=args.seed).how.split(":")[0]
    return trials.random_trial(directory, rng, seed=args.seed).how.split(" after")[0]


def command(args: argparse.Namespace, console: Console) -> int:
    if not 1 <= args.trials <= TRIALS_MAX:
        raise ConfigError(f"--trials must be in 1..{TRIALS_MAX}, got {args.trials}")
    if args.rejoin and not args.cluster:
        raise ConfigError("--rejoin needs --cluster (a node rejoins a running cluster)")
    if args.dir is not None and args.dir.is_dir() and _holds_trials(args.dir):
        raise ConfigError(  # its trials would recover an earlier drill's logs, maybe of
            f"--dir {args.dir} holds an earlier drill's trials (trial*): name an empty or new "
            "folder"  # another seed, and report a durability failure that is none
        )
    root = make_dir(args.dir or Path(tempfile.mkdtemp(prefix="dgcc_drill_")),
                    "--dir {path}: cannot use it ({why})")  # fmt: skip
    rng = random.Random(args.seed)
    kinds: Counter[str] = Counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("crash trials", total=args.trials)
            for number in range(args.trials):
                kinds[_one(args, root, number, rng)] += 1
                progress.advance(task)
    except trials.DrillFailure as failure:
        console.print(f"[red]trial failed (seed {args.seed}): {failure}[/] (kept {root})")
        return 1
    except BaseException:  # Ctrl-C, SIGTERM, an error: a temp folder of ours is not kept
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
        raise
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    table = Table(title="dgcc drill")
    table.add_column("how the process died")
    table.add_column("trials", justify="right")
    for how, count in sorted(kinds.items()):
        table.add_row(how, str(count))
    console.print(table)
    every = "the trial" if args.trials == 1 else f"all {args.trials} trials"
    console.print(f"{every} recovered correctly (seed {args.seed})")
    return 0


def _holds_trials(directory: Path) -> bool:
    try:
        return any(directory.glob("trial*"))
    except OSError as error:  # unreadable
        raise ConfigError(
            f"--dir {directory}: cannot read it ({error.strerror or error})"
        ) from None
