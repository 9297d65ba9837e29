"""PNG plots of a run's metric history (matplotlib Agg; reads only the logged rows)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    points = [(row["step"], row[key]) for row in rows if isinstance(row.get(key), int | float)]
    return [p[0] for p in points], [p[1] for p in points]


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _curve(ax, rows: list[dict], key: str, label: str) -> list[float]:
    """`key` per step, raw (faint) and as a moving average over 10 steps; its values."""
    steps, values = _series(rows, key)
    ax.plot(steps, values, alpha=0.3, label=f"{label} (per step)")
    if values:
        ax.plot(steps, _moving_average(values, 10), label="moving average (10)")
    return values


def _legend(ax, **kwargs) -> None:
    """The axes' legend, or (nothing drawn on them: a run stopped before its first step, a
    metric never logged or never finite) a note saying so, not matplotlib's warning about a
    legend of nothing."""
    if any(len(line.get_xdata()) for line in ax.lines) or ax.patches:
        ax.legend(**kwargs)
    else:
        ax.text(0.5, 0.5, "nothing to plot", ha="center", va="center",
                transform=ax.transAxes)  # fmt: skip


def plot_rewards(rows: list[dict], path: Path, accuracy_key: str = "eval/accuracy") -> Path:
    """Reward per step (raw + moving average) and held-out accuracy on a second panel."""
    fig, (ax_reward, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    _curve(ax_reward, rows, "critic/score/mean", "reward")
    ax_reward.set(xlabel="step", ylabel="mean reward", title="training reward")
    _legend(ax_reward)
    steps, accuracy = _series(rows, accuracy_key)
    ax_acc.plot(steps, [100 * a for a in accuracy], marker="o")
    ax_acc.set(
        xlabel="step", ylabel="accuracy (%)", title="held-out greedy accuracy", ylim=(0, 100)
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_timings(rows: list[dict], path: Path) -> Path:
    """Stacked per-phase seconds for each step."""
    timed_rows = [row for row in rows if "timing_s/step" in row]
    keys = sorted({k for row in timed_rows for k in row if k.startswith("timing_s/")})
    keys = [k for k in keys if k != "timing_s/step" and any(row.get(k) for row in timed_rows)]
    fig, ax = plt.subplots(figsize=(8, 4))
    steps = [row["step"] for row in timed_rows]
    bottom = [0.0] * len(steps)
    for key in keys:
        values = [float(row.get(key, 0.0)) for row in timed_rows]
        ax.bar(steps, values, bottom=bottom, label=key.removeprefix("timing_s/"), width=1.0)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(xlabel="step", ylabel="seconds", title="step time by phase")
    _legend(ax, fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_sft_loss(rows: list[dict], path: Path) -> Path:
    """An SFT run's answer-token loss per step (raw + moving average) with its held-out loss,
    and the learning rate on a second panel."""
    fig, (ax_loss, ax_lr) = plt.subplots(1, 2, figsize=(11, 4))
    _curve(ax_loss, rows, "sft/loss", "train loss")
    held_steps, held = _series(rows, "sft/heldout_loss")
    if held:
        ax_loss.plot(held_steps, held, marker="o", label="held-out loss")
    ax_loss.set(xlabel="step", ylabel="answer-token NLL", title="SFT loss")
    _legend(ax_loss)
    steps, rates = _series(rows, "sft/lr")
    ax_lr.plot(steps, rates)
    ax_lr.set(xlabel="step", ylabel="learning rate", title="learning rate")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_reward_model(rows: list[dict], path: Path) -> Path:
    """A reward model's (`yatt rm`) Bradley–Terry loss per step (raw + moving average), and the
    share of pairs it ranked right: each step's (moving average) and the held-out pairs'."""
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    _curve(ax_loss, rows, "rm/loss", "loss")
    ax_loss.set(xlabel="step", ylabel="-log sigmoid(chosen - rejected)", title="reward model loss")
    _legend(ax_loss)
    steps, accuracy = _series(rows, "rm/accuracy")
    if accuracy:
        ax_acc.plot(steps, [100 * a for a in _moving_average(accuracy, 10)],
                    label="training pairs (moving average, 10)")  # fmt: skip
    held_steps, held = _series(rows, "rm/heldout_accuracy")
    if held:
        ax_acc.plot(held_steps, [100 * a for a in held], marker="o", label="held-out pairs")
    ax_acc.set(xlabel="step", ylabel="ranked right (%)", title="pairs ranked right", ylim=(0, 100))
    _legend(ax_acc)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_dpo(rows: list[dict], path: Path) -> Path:
    """A DPO run's (`yatt dpo`) loss per step (raw + moving average), and the implicit rewards
    beta * (log pi - log pi_ref) of the chosen and rejected responses (moving averages)."""
    fig, (ax_loss, ax_reward) = plt.subplots(1, 2, figsize=(11, 4))
    _curve(ax_loss, rows, "dpo/loss", "loss")
    ax_loss.set(xlabel="step", ylabel="-log sigmoid(r_chosen - r_rejected)", title="DPO loss")
    _legend(ax_loss)
    for key, label in (("dpo/reward_chosen", "chosen"), ("dpo/reward_rejected", "rejected")):
        steps, rewards = _series(rows, key)
        if rewards:
            average = _moving_average(rewards, 10)
            ax_reward.plot(steps, average, label=f"{label} (moving average, 10)")
    ax_reward.axhline(0.0, color="grey", linewidth=0.8)
    ax_reward.set(xlabel="step", ylabel="beta * (log pi - log pi_ref)", title="implicit rewards")
    _legend(ax_reward)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
