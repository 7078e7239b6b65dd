"""Run under ``accelerate launch --multi_gpu --num_processes 2`` (gloo on CPU): GiGPO on two processes whose episodes
last 1 turn (rank 0) and 3 turns (rank 1), 3 rows each, groups of 2, so that the middle group spans both ranks. Each
rank appends its training rows, with each turn's advantage, to ``<out>/trajectories-rank<k>.jsonl``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from helpers import EchoEnvironment, agentic_args, lookup_dataset  # noqa: E402

from trl_agentic import AgenticGRPOTrainer  # noqa: E402
from trl_agentic.toy import build_tiny_model, build_tokenizer  # noqa: E402

out_dir, model_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))


def agent_tokens_reward(completions, trajectory, **kwargs):
    return [float(t.num_agent_tokens % 7) for t in trajectory]


tokenizer = build_tokenizer()
if rank == 0 and not os.path.exists(os.path.join(model_dir, "config.json")):
    build_tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
args = agentic_args(type("P", (), {"__truediv__": lambda self, other: os.path.join(out_dir, other)})(),
                    per_device_train_batch_size=3, num_generations=2, max_steps=2, max_turns=4,
                    max_completion_length=64, max_tokens_per_turn=6, gigpo=True, scale_rewards="none",
                    gigpo_gamma=0.9, trajectory_dir=out_dir)
trainer = AgenticGRPOTrainer(model=model_dir, reward_funcs=agent_tokens_reward, args=args,
                             train_dataset=lookup_dataset(12), processing_class=tokenizer,
                             environment=lambda: EchoEnvironment(turns=1 if rank == 0 else 3))
trainer.train()
trainer.end_training()
