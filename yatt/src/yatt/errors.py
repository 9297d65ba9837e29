"""The yatt exception tree: every error raised for bad user input derives from YattError.

    YattError
     ├── ConfigError   bad config key/value/type (message names key, value, allowed)
     │    ├── RunComplete  checkpoint.resume=auto on a run that already took all its steps
     │    └── PromptTooLong a prompt plus the response budget exceeds the model's positions
     ├── DataError     bad dataset file or row (names file, line/row number, field)
     ├── ModelError    model folder missing/unloadable, unknown model name
     └── SamplingError the policy's logits hold a NaN or an infinity (a diverged policy)

Messages are one line and name the bad value; entry points print them without a traceback.
"""

__all__ = [
    "ConfigError",
    "DataError",
    "ModelError",
    "PromptTooLong",
    "RunComplete",
    "SamplingError",
    "YattError",
]


class YattError(Exception):
    """Base class for errors caused by bad user input (config, data, model folders)."""


class ConfigError(YattError):
    """A config key is unknown, or its value has the wrong type or is out of range."""


class RunComplete(ConfigError):
    """`checkpoint.resume=auto` found the run's newest checkpoint at its last step: nothing is
    left to train (the CLI says so and exits 0, so rerunning a finished job's command is no
    error; the Python API raises it, a ConfigError, as it raises for any run with no steps).

    Args:
        message: what was found, one line.
        run_dir: the complete run's folder.
        checkpoint: its last checkpoint's folder.
    """

    def __init__(self, message: str, run_dir: str, checkpoint: str) -> None:
        super().__init__(message)
        self.run_dir, self.checkpoint = run_dir, checkpoint


class PromptTooLong(ConfigError):
    """A prompt plus the response budget needs more positions than the model has; `row` is
    the prompt's index in the request (a caller names where it came from). Raised by the
    rollout engines; defined here so a process that only catches it (a controller) need not
    import them."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


class DataError(YattError):
    """A dataset file is missing or unreadable, or one of its rows is malformed."""


class ModelError(YattError):
    """A model folder is missing or unloadable, or a model name is unknown."""


class SamplingError(YattError):
    """The policy's next-token logits hold a NaN or an infinity, so no token can be sampled
    (the message names the decode step and what to change)."""


class WorkerError(YattError):
    """A worker process of the distributed controllers failed a call or died (the message
    names the worker and the cause)."""


class WorkerDied(WorkerError):
    """A worker process of the distributed controllers exited (crash, os._exit, OOM killer)."""
