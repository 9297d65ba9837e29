"""RL roles as plain in-process classes, one per file, sharing the small `Role` interface:
policy (trained), reference (frozen, KL only), critic (PPO values), reward (rule functions,
Bradley–Terry model, judge) and rollout (the sampling engine). `yatt.control.rank` hosts them
in Ray actors; they hold all their state explicitly, so a move needs no change here."""

from yatt.roles.base import Role
from yatt.roles.critic import CriticRole
from yatt.roles.policy import PolicyRole
from yatt.roles.reference import ReferenceRole
from yatt.roles.reward import RewardRole
from yatt.roles.rollout import RolloutRole

__all__ = ["CriticRole", "PolicyRole", "ReferenceRole", "RewardRole", "Role", "RolloutRole"]
