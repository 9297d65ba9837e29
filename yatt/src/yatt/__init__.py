"""yatt: RL post-training for language models (GRPO, PPO, RLOO, REINFORCE++) with parallel
controllers and dynamic placement of rollout, reward and training. See docs/architecture.md."""
