"""How the policy update's micro-batch size sets its speed on a GPU (a diagnostic).

Usage: ``python yatt/bench/gpu_update.py [cuda|cpu] [--profile]``

A random-init SmolLM2-135M-shaped Llama (fp32, as the controllers train it) and one GRPO
update (`PolicyRole.update`) of 128 rows: 16 prompts of 48 tokens x 8 completions of 128 tokens,
shared-prefix log-probs, fused AdamW. Prints the best of three timed updates (after one warm-up)
at micro-batches of 8 rows (the default), 32 rows, and 8 rows with TF32 matmuls; ``--profile``
adds torch.profiler's tables of one default update. On CPU it runs 8 rows of 16 tokens (a smoke
test). A small model's update is bound by kernel launches when micro-batches are small.
"""

from __future__ import annotations

import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from yatt.batch import RolloutBatch
from yatt.config import AlgoConfig, OptimConfig
from yatt.roles.policy import PolicyRole

SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
             num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
             max_position_embeddings=2048)  # fmt: skip


def main(argv: list[str]) -> int:
    device = torch.device(argv[0] if argv and not argv[0].startswith("-") else "cuda")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).to(device)
    rows, prompt, response = (128, 48, 128) if device.type == "cuda" else (8, 48, 16)
    batch = _batch(rows, prompt, response)
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch "
          f"{torch.__version__}: {rows} rows x ({prompt} + {response}) tokens")  # fmt: skip
    for label, micro, tf32 in (("micro-batch 8", 8, False), ("micro-batch 32", 32, False),
                               ("micro-batch 8, TF32", 8, True)):  # fmt: skip
        torch.backends.cuda.matmul.allow_tf32 = tf32
        policy = PolicyRole(model, algo=AlgoConfig(micro_batch_size=micro),
                            optim=OptimConfig(lr=1e-6), total_updates=100)  # fmt: skip
        times = [_timed(policy, batch, device) for _ in range(4)][1:]  # the first warms up
        print(f"{label}: {min(times):.3f} s (runs {', '.join(f'{t:.3f}' for t in times)})")
    torch.backends.cuda.matmul.allow_tf32 = False
    if "--profile" in argv:
        _profile(PolicyRole(model, algo=AlgoConfig(), optim=OptimConfig(lr=1e-6),
                            total_updates=100), batch, device)  # fmt: skip
    return 0


def _batch(rows: int, prompt: int, response: int) -> RolloutBatch:
    """`rows` / 8 groups of 8 completions, each group sharing its prompt."""
    ids = torch.randint(10, 40000, (rows, prompt + response))
    for start in range(0, rows, 8):
        ids[start : start + 8, :prompt] = ids[start, :prompt]
    attention = torch.ones_like(ids)
    mask = attention[:, prompt:].float()
    return RolloutBatch(
        input_ids=ids, attention_mask=attention, response_mask=mask, prompt_width=prompt,
        group_ids=torch.arange(rows // 8).repeat_interleave(8), rewards=torch.zeros(rows),
        advantages=torch.randn(rows)[:, None] * mask,
    ).check()  # fmt: skip


def _timed(policy: PolicyRole, batch: RolloutBatch, device: torch.device) -> float:
    start_s = time.perf_counter()
    policy.update(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start_s


def _profile(policy: PolicyRole, batch: RolloutBatch, device: torch.device) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    policy.update(batch)
    with profile(activities=activities) as prof:
        _timed(policy, batch, device)
    for key in ("self_cpu_time_total", *(["self_cuda_time_total"] * (device.type == "cuda"))):
        print(prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=60))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
