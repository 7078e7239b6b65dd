"""Run under ``accelerate launch --multi_gpu --num_processes 2`` (gloo on CPU): self-play on Race (tests/seat_games.py)
over two processes, 2 rows each and groups of 4, so that each GRPO group spans both ranks (one game on each) and
each seat's group holds one run of each rank. The policy's moves are scripted, seeded per rank (the games differ).
Each rank appends its training rows, with their advantage, to ``<out>/trajectories-rank<k>.jsonl``."""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from datasets import Dataset  # noqa: E402
from helpers import ScriptedGenerator, agentic_args  # noqa: E402
from seat_games import Race, race_rows, seat_reward  # noqa: E402

from trl_agentic import AgenticGRPOTrainer  # noqa: E402
from trl_agentic.rollout.seats import Seats  # noqa: E402
from trl_agentic.toy import build_tiny_model, build_tokenizer  # noqa: E402

out_dir, model_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))
tokenizer = build_tokenizer()
if rank == 0 and not os.path.exists(os.path.join(model_dir, "config.json")):
    build_tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
args = agentic_args(type("P", (), {"__truediv__": lambda self, other: os.path.join(out_dir, other)})(),
                    per_device_train_batch_size=2, num_generations=4, max_steps=2, max_turns=4,
                    max_completion_length=64, max_tokens_per_turn=6, scale_rewards="none", trajectory_dir=out_dir)
trainer = AgenticGRPOTrainer(model=model_dir, reward_funcs=seat_reward, args=args, processing_class=tokenizer,
                             train_dataset=Dataset.from_list(race_rows(8, target=6)),
                             environment=Seats(Race, {"A": "policy", "B": "policy"}))
rng = random.Random(rank)
trainer.rollout_seam.engine.generator = ScriptedGenerator(tokenizer, lambda ids: rng.choice(["[1]", "[2]", "[2]"]))
trainer.train()
trainer.end_training()
