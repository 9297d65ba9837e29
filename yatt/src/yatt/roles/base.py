"""The small interface every role worker implements (control/rank.py hosts roles in worker
processes, in-process or as Ray actors).

A role holds all its state explicitly (no globals), so it can move into another process: it
exposes `state_dict`/`load_state_dict` for checkpoints; `name` names it in assertion messages.
"""

from typing import Any

import torch


class Role:
    """Base class of the in-process role workers (policy, reference, critic, reward, rollout)."""

    name: str = "role"

    @property
    def device(self) -> torch.device:
        """Where the role's model is now (colocation may move it); batches stay on the host
        and each micro-batch goes here. Roles without a `model` attribute have no device."""
        return next(self.model.parameters()).device  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this role exactly (empty for stateless roles)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        assert not state, f"{self.name} role is stateless but got state keys {sorted(state)}"
