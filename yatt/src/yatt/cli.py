"""The `yatt` command: train, eval, sft, rm, dpo, models prepare, report, demo.

    yatt train grpo_addition rollout.n_samples=8 train.steps=50
    yatt eval runs/grpo_addition/checkpoints/step_000050 eval.n=200
    yatt sft tiny_test data.path=answers.jsonl
    yatt rm rm_addition      # a reward model: reward.model_path=runs/rm_addition/reward_model
    yatt dpo dpo_addition    # the policy trained on preference pairs -> runs/dpo_addition/model
    yatt models prepare smollm2
    yatt report runs/demo
    yatt demo

Bad input (config, data, model folders, arguments) prints one line on stderr and exits 2.
Ctrl-C or SIGTERM stops a command with one line (exit 130 / 143); a training run's line says
where it can go on from.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from yatt.errors import YattError

if TYPE_CHECKING:
    from yatt.config import Config

__all__ = ["main"]

logger = logging.getLogger(__name__)
EXIT_BAD_INPUT = 2
LOG_LEVEL_ENV = "YATT_LOG_LEVEL"  # overrides logging.level


class _UsageError(Exception):
    """argparse found bad arguments (raised instead of argparse's two-line exit)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # main() prints "yatt: error: "; name only the subcommand ("train: ...") on top of it
        command = self.prog.removeprefix("yatt").strip()
        raise _UsageError(f"{command}: {message}" if command else message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="yatt", description="RL post-training for language models")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    presets = ", ".join(_presets())
    _add_training_command(
        commands, "train", "run RL training from a preset or YAML file",
        "RL training from a preset or YAML file.", presets, "train.steps=50",
    )  # fmt: skip
    evaluate = commands.add_parser("eval", help="greedy held-out accuracy of a model folder")
    evaluate.add_argument("model", help="a model folder, a checkpoint folder or a known name")
    evaluate.add_argument(
        "overrides",
        nargs="*",
        default=[],  # (without, a missing model reads as if overrides were required too)
        help="dotted overrides of the saved config, e.g. eval.n=200 data.path=... model.dtype=...",
    )
    _add_training_command(
        commands, "sft", "supervised warm start on prompt/answer data",
        "Supervised warm start on prompt/answer rows.", presets, "data.path=rows.jsonl",
    )  # fmt: skip
    _add_training_command(
        commands, "rm", "train a Bradley-Terry reward model on preference pairs",
        "A reward model for reward.model_path, from prompt/chosen/rejected rows (data.path) or "
        "pairs made from a task (data.task): its answers over slips, or the model's own samples "
        "scored by reward.fns (data.rejected=slips|samples|both); no checkpoints, a stopped run "
        "starts again.", presets, "data.path=pairs.jsonl", resumes=False,
    )  # fmt: skip
    _add_training_command(
        commands, "dpo", "train the policy on preference pairs (DPO)",
        "Direct preference optimisation of the policy, against itself before training as the "
        "reference (algo.dpo_beta), on the pairs yatt rm takes: prompt/chosen/rejected rows "
        "(data.path) or pairs made from a task (data.rejected=slips|samples|both); held-out "
        "accuracy before and after; checkpoints keep the pairs and reference log-probs, so a "
        "resumed run goes on without sampling again.", presets, "data.rejected=samples",
    )  # fmt: skip
    models = commands.add_parser("models", help="manage local models")
    model_commands = models.add_subparsers(
        dest="models_command", required=True, parser_class=_Parser, metavar="{prepare}"
    )
    prepare = model_commands.add_parser("prepare", help="convert a bundled model to safetensors")
    prepare.add_argument("name", help="a known model name, e.g. smollm2")
    report = commands.add_parser("report", help="summary table and plots of a run folder")
    report.add_argument(
        "run_dir", help="a run folder (logging.run_dir) of yatt train, sft, rm or dpo"
    )
    report.add_argument("--no-plots", action="store_true", help="only print the summary table")
    demo = commands.add_parser("demo", help="GRPO on two-digit addition; learns in ~10 minutes")
    demo.add_argument("overrides", nargs="*", help="dotted overrides of the demo preset")
    return parser


_OVERRIDES_HELP = (
    "Any setting can be overridden as section.key=value; the sections are model, data, "
    "rollout, algo, reward, optim, train, eval, logging, checkpoint and control (an unknown key "
    "is an error that lists them). A run writes to logging.run_dir; {resume}"
    "logging.overwrite=true replaces it. Presets live in yatt/src/yatt/configs/."
)
_RESUME_HELP = "checkpoint.resume=latest (or auto) continues the run there, "


def _add_training_command(
    commands: argparse._SubParsersAction, name: str, help: str, summary: str, presets: str,
    example: str, resumes: bool = True,
) -> None:  # fmt: skip
    """`yatt train`, `sft`, `rm` or `dpo`: a config (a preset or a YAML file) and dotted overrides
    (`resumes`: the command continues from checkpoints)."""
    more = _OVERRIDES_HELP.format(resume=_RESUME_HELP if resumes else "")
    command = commands.add_parser(name, help=help, description=f"{summary} {more}")
    command.add_argument("config", help=f"a YAML file or a preset name ({presets})")
    command.add_argument(
        "overrides", nargs="*", default=[], help=f"dotted overrides, e.g. {example}"
    )


def _presets() -> list[str]:
    from yatt.config import preset_names

    return preset_names()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # Hugging Face's own bars (loading and writing model shards) would cut into yatt's
    # progress bar and logs at every load and checkpoint; set it to 0 to see them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with _stop_signals():
        try:
            parser = _parser()
            if not (sys.argv[1:] if argv is None else argv):  # a bare `yatt`: what it can do
                parser.print_help(sys.stderr)
                return EXIT_BAD_INPUT
            args = parser.parse_args(argv)
            from yatt.common import setup_logging
            from yatt.config import log_level

            setup_logging(log_level(os.environ.get(LOG_LEVEL_ENV, "INFO"), LOG_LEVEL_ENV))
            return _dispatch(args)
        except (_UsageError, YattError) as exc:
            message = " ".join(str(exc).split())  # one line, whatever the message held
            print(f"yatt: error: {message}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (below): one line, not a trace
            terminated = isinstance(stop, _Terminated)
            what = "terminated" if terminated else "interrupted"
            print(f"yatt: {what}{_resume_hint(stop)}", file=sys.stderr)
            return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a run stops as on Ctrl-C (Ray's workers and
    the processes `ray.init` started stop with it)."""


_STOPS: list[KeyboardInterrupt] = []  # the stop signals that came during `_stop_signals`


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """Within the block, SIGTERM raises `_Terminated` and Ctrl-C (unless this process was
    started with it ignored) `KeyboardInterrupt`, each also noted in `_STOPS`: one raised while
    a finaliser runs is swallowed by Python, so each training step checks again
    (`_stoppable`). Main thread only, where signal handlers run; the previous handlers come
    back after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        _STOPS.append(_Terminated() if signum == signal.SIGTERM else KeyboardInterrupt())
        raise _STOPS[-1]

    wanted = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        wanted.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, stop) for signum in wanted}
    _STOPS.clear()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stoppable(progress: Callable[[int, int, dict[str, float]], None]):
    """`progress`, called after each training step, first raising a stop signal that came
    (`_stop_signals`): a run stops within a step even if the signal's own raise was lost."""

    def step(done: int, total: int, metrics: dict[str, float]) -> None:
        if _STOPS:
            raise _STOPS[-1]
        progress(done, total, metrics)

    return step


def _resume_hint(stop: KeyboardInterrupt) -> str:
    """Where an interrupted training run can go on from (`_train`, `_sft` and `_dpo` note its
    folder on the exception as `run_dir`), or ""."""
    run_dir = getattr(stop, "run_dir", None)
    if run_dir is None:
        return ""
    from yatt.checkpoint import list_checkpoints

    found = list_checkpoints(Path(run_dir))
    if not found:
        return f"; {run_dir} holds no checkpoint to go on from (checkpoint.every=N saves them)"
    return (
        f"; the newest checkpoint is {found[-1]}: rerun with checkpoint.resume=latest to go on "
        "from it"
    )


def _dispatch(args: argparse.Namespace) -> int:
    if args.command in ("train", "sft", "dpo"):
        with contextlib.suppress(_Done):  # a complete run met again: nothing to do, no error
            {"train": _train, "sft": _sft, "dpo": _dpo}[args.command](args.config, args.overrides)
    elif args.command == "rm":
        _rm(args.config, args.overrides)
    elif args.command == "eval":
        _eval(args.model, args.overrides)
    elif args.command == "models":
        from yatt.models import prepare_model

        print(prepare_model(args.name))
    elif args.command == "report":
        _report(Path(args.run_dir), plots=not args.no_plots)
    elif args.command == "demo":
        _demo(args.overrides)
    return 0


@contextlib.contextmanager
def _noting_run_dir(run_dir: str) -> Iterator[None]:
    """An interrupt raised within the block carries the run's folder (`_resume_hint`)."""
    try:
        yield
    except KeyboardInterrupt as stop:
        stop.run_dir = run_dir  # type: ignore[attr-defined]
        raise


def _configured(config):
    """`config`, once its `logging.level` is applied (unless YATT_LOG_LEVEL overrides it)."""
    from yatt.common import setup_logging

    if LOG_LEVEL_ENV not in os.environ:
        setup_logging(config.logging.level)
    return config


def _train(preset: str, overrides: list[str]):
    """Run one training job with a progress bar, then plots and the summary table."""
    from yatt.config import load_config
    from yatt.report import progress_bar
    from yatt.run_checks import check_training_dtype
    from yatt.trainer import Trainer

    config = _configured(load_config(preset, overrides))
    check_training_dtype(config)  # both paths below train the weights model.dtype loads
    logger.info("config %s, run folder %s", preset, config.logging.run_dir)
    if config.control.backend == "ray":  # distributed controllers (yatt.control)
        from yatt.control import fit_distributed

        with (
            _complete_run_is_done(final_model=True),
            _noting_run_dir(config.logging.run_dir),
            progress_bar(config.train.steps, 0, config.logging.progress) as progress,
        ):
            result = fit_distributed(config, config.control, _stoppable(progress))
        _report(Path(config.logging.run_dir), plots=config.logging.plots)
        return result
    with _complete_run_is_done(final_model=False), _noting_run_dir(config.logging.run_dir):
        trainer = Trainer(config)
        with progress_bar(config.train.steps, trainer.step, config.logging.progress) as progress:
            result = trainer.fit(_stoppable(progress))
    # From the run folder's metrics, as for Ray runs: a resumed run's summary and plots cover
    # all of it, not only the part this process trained.
    _report(Path(result.run_dir), plots=config.logging.plots)
    return result


def _resumable_job(
    run: Callable[..., Path], preset: str, overrides: list[str], metric: str
) -> Path:
    """A job that checkpoints (`yatt sft`, `yatt dpo`) with a progress bar of `metric`: a
    complete run met again is done (`_complete_run_is_done`), an interrupt notes the run's
    folder; then the summary table and plots from the run folder, as `yatt train` makes them
    (a resumed run's cover all of it). Returns the saved model's folder."""
    from yatt.config import load_config
    from yatt.report import progress_bar

    config = _configured(load_config(preset, overrides))
    with (
        _complete_run_is_done(final_model=True),
        _noting_run_dir(config.logging.run_dir),
        progress_bar(
            config.train.steps, 0, config.logging.progress, metric=metric, label="loss"
        ) as bar,
    ):
        folder = run(config, progress=_stoppable(bar))
    _report(folder.parent, plots=config.logging.plots)
    return folder


def _sft(preset: str, overrides: list[str]) -> None:
    """Supervised warm start (`_resumable_job`)."""
    from yatt.sft import run_sft

    _resumable_job(run_sft, preset, overrides, "sft/loss")


def _rm(preset: str, overrides: list[str]) -> None:
    """A reward model with a progress bar, then its summary table and plot, from the run
    folder as the other jobs make them."""
    from yatt.config import load_config
    from yatt.report import progress_bar
    from yatt.rm import run_reward_model

    config = _configured(load_config(preset, overrides))
    with progress_bar(
        config.train.steps, 0, config.logging.progress, metric="rm/loss", label="loss"
    ) as bar:
        folder = run_reward_model(config, progress=_stoppable(bar))
    _report(folder.parent, plots=config.logging.plots)
    logger.info("score with it: yatt train ... reward.model_path=%s", folder)


def _dpo(preset: str, overrides: list[str]) -> None:
    """DPO (`_resumable_job`), then where to evaluate its model."""
    from yatt.dpo import run_dpo

    folder = _resumable_job(run_dpo, preset, overrides, "dpo/loss")
    logger.info("evaluate it: yatt eval %s", folder)


class _Done(Exception):
    """A complete run met again (`_complete_run_is_done`): the command has nothing to do."""


@contextlib.contextmanager
def _complete_run_is_done(final_model: bool) -> Iterator[None]:
    """Rerunning a finished job's command with `checkpoint.resume=auto` (what a wrapper that
    restarts preempted jobs does) is no error: `RunComplete` becomes one line, the run's
    summary from its folder, and `_Done` (exit 0). Where the run ends by saving `model/`
    (`final_model`: SFT, the distributed controllers) and that folder is missing (stopped
    between its last checkpoint and the save), a warning says where the weights are."""
    from yatt.errors import RunComplete

    try:
        yield
    except RunComplete as complete:
        logger.info("%s", complete)
        if final_model and not (Path(complete.run_dir) / "model").is_dir():
            logger.warning(
                "%s has no model/ folder (the run stopped before saving it): the trained "
                "weights are in %s/policy",
                complete.run_dir,
                complete.checkpoint,
            )
        _report(Path(complete.run_dir), plots=False)
        raise _Done from None


def _report(run_dir: Path, plots: bool) -> None:
    """The summary table of a run folder's metrics (and, for a distributed run, of its
    control.json), and its plots written beside them (an RL run's reward and timing plots, an
    SFT run's loss plot)."""
    from yatt.report import (
        console,
        control_table,
        evals_of,
        load_history,
        summary_table,
        write_plots,
    )

    history = load_history(run_dir)
    console.print(summary_table(history, evals_of(history)))
    control = control_table(run_dir)
    if control is not None:
        console.print(control)
    if plots and history:
        for path in write_plots(history, run_dir):
            logger.info("wrote %s", path)


def _eval(model: str, overrides: list[str]) -> None:
    """Greedy held-out accuracy of `model`. A folder holding a config.yaml (a checkpoint, a
    run's saved `model/`) is evaluated on the data and eval settings of that run; `overrides`
    win over them."""
    from yatt.builders import build_data, build_model
    from yatt.errors import ConfigError
    from yatt.evaluate import evaluate_run
    from yatt.rollout import make_engine
    from yatt.run_checks import (
        check_budgets_fit_model,
        check_no_pair_settings,
        check_rewards_grade_task,
        check_rows_have_answers,
    )
    from yatt.trainer import configure_threads

    config, unlike = _eval_config(model, overrides)
    config = _configured(config)
    check_rewards_grade_task(config, train=False, evaluate=True)
    check_no_pair_settings(config, "yatt eval")
    if config.eval.n == 0:
        raise ConfigError("eval.n=0 leaves nothing to evaluate; pass eval.n=<problems>")
    configure_threads(config.train.torch_threads)
    policy, tokenizer = build_model(config.model)
    check_budgets_fit_model(config, policy, train=False)
    _, heldout = build_data(config.data)
    check_rows_have_answers(config, (), heldout, train=False, evaluate=True)
    engine = make_engine(config.rollout.backend, policy.eval(), tokenizer)
    start_s = time.perf_counter()
    accuracy, _ = evaluate_run(engine, tokenizer, heldout[: config.eval.n], config)
    kind = f"problems of a split unlike the run's ({unlike})" if unlike else "problems"
    print(
        f"accuracy {100 * accuracy:.1f}% on {min(config.eval.n, len(heldout))} "
        f"{'' if unlike else 'held-out '}{config.data.path or config.data.task} {kind} "
        f"({time.perf_counter() - start_s:.1f} s)"
    )


def _eval_config(model: str, overrides: list[str]) -> tuple[Config, str]:
    """The config `yatt eval` uses: the folder's saved config.yaml (else the defaults), then
    model.path set to the folder's model, then `overrides`. A saved eval.n=0 (a run that did
    not evaluate) gives way to the default eval.n unless `overrides` set it. Also which
    overrides re-split the run's own data ("" for none): its held-out problems are then not
    the run's, and some may be prompts it trained on (said in a warning and the result)."""
    import dataclasses

    from yatt.checkpoint import policy_folder
    from yatt.config import AlgoConfig, EvalConfig, load_config
    from yatt.errors import ConfigError
    from yatt.run_checks import DPO_SETTINGS

    folder = Path(model)
    _refuse_a_run_folder(folder)
    saved = folder / "config.yaml"
    if not saved.is_file() and folder.name == "policy":  # a checkpoint's model: its config
        saved = folder.parent / "config.yaml"  # is the checkpoint's
    # a saved model folder holds merged weights (a LoRA run's too): a plain model
    model_path = policy_folder(folder) if folder.exists() else model
    given = [f"model.path={model_path}", "model.lora_rank=0"]
    if not saved.is_file():
        logger.info("eval: using the default config (no config.yaml in %s)", model)
        return load_config(None, [*given, *overrides]), ""
    logger.info("eval: using the run's config %s (overrides win over it)", saved)
    # (its control section is for training: one that needs LoRA, say, would refuse the merge;
    # so are a yatt dpo run's pair settings, which yatt eval refuses when asked for them)
    pairs = ["data.rejected=slips"]
    pairs += [f"algo.{name}={getattr(AlgoConfig, name)}" for name in DPO_SETTINGS]
    config = load_config(str(saved), [*given, *pairs, *overrides], defaults_for=("control",))
    try:
        run = load_config(str(saved), given, defaults_for=("control",)).data
    except ConfigError:  # a saved setting a later version refuses, which `overrides` fixed
        run = config.data
    if config.eval.n == 0 and not any(o.split("=")[0].strip() == "eval.n" for o in overrides):
        n = EvalConfig().n
        logger.info("eval: the run had eval.n=0; evaluating eval.n=%d (pass eval.n= to change)", n)
        config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, n=n))
    data, unlike = config.data, ""
    if (data.path, data.task) == (run.path, run.task):  # the run's own data, split again
        changed = [  # (a smaller held-out set is a prefix of the run's; rows from a file do
            key  # not depend on n_train)
            for key in ("seed", "n_heldout", *(() if data.path else ("n_train",)))
            if getattr(data, key) > getattr(run, key)
            or (key != "n_heldout" and getattr(data, key) != getattr(run, key))
        ]
        unlike = ", ".join(f"data.{k}={getattr(data, k)}, not {getattr(run, k)}" for k in changed)
    if unlike:
        logger.warning(
            "eval: %s: these are not the run's held-out problems, and may include prompts it "
            "trained on", unlike,
        )  # fmt: skip
    return config, unlike


def _refuse_a_run_folder(folder: Path) -> None:
    """A run folder (`logging.run_dir`) holds models but is none: name the ones to evaluate."""
    from yatt.checkpoint import list_checkpoints
    from yatt.errors import ConfigError

    if (folder / "config.json").is_file() or (folder / "policy").is_dir():
        return  # a model, or a checkpoint
    models = [folder / "model"] if (folder / "model" / "config.json").is_file() else []
    models += list_checkpoints(folder)[-1:]
    if models:
        raise ConfigError(
            f"{folder} is a run folder, not a model: evaluate "
            f"{' or '.join(str(path) for path in models)}"
        )
    if (folder / "metrics.jsonl").is_file() or (folder / "sft_metrics.jsonl").is_file():
        raise ConfigError(
            f"{folder} is a run folder that kept no model (no checkpoint, no model/): nothing "
            "to evaluate; a run keeps one with checkpoint.every=N or checkpoint.at_end=true"
        )


def _demo(overrides: list[str]) -> None:
    """`yatt train demo` plus a before/after line (the preset evaluates at start and end)."""
    from yatt.report import console

    start_s = time.perf_counter()
    # each demo starts afresh in its own folder; a run_dir of the user's own is theirs to keep
    own_folder = any(item.split("=", 1)[0].strip() == "logging.run_dir" for item in overrides)
    fresh = [] if own_folder else ["logging.overwrite=true"]
    result = _train("demo", [*fresh, *overrides])
    wall_s = time.perf_counter() - start_s
    if len(result.evals) >= 2:
        (_, before), (last_step, after) = result.evals[0], result.evals[-1]
        console.print(
            f"[bold]held-out accuracy: {100 * before:.1f}% -> {100 * after:.1f}% "
            f"after {last_step} GRPO step{'s' if last_step != 1 else ''} "
            f"({wall_s / 60:.1f} min in all); "
            f"plots and metrics in {result.run_dir}/"
        )


if __name__ == "__main__":
    sys.exit(main())
