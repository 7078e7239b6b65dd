"""Run under ``accelerate launch --num_processes 2``: an agent trained through the endpoint on two processes, rank 0's
agents making one model call per run and rank 1's three (uneven), so rank 0 keeps generating dummies while rank 1's
agents still talk to the policy.

Writes ``<out>/rank<k>.json`` with the generation calls this rank made (every call, dummies included), the mask
audits and agent metrics it logged, and a checksum of its policy after training.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from helpers import agentic_args, lookup_dataset  # noqa: E402

from trl_agentic import AgenticGRPOTrainer  # noqa: E402
from trl_agentic.rollout import generation  # noqa: E402
from trl_agentic.toy import build_tiny_model, build_tokenizer  # noqa: E402

out_dir, model_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))
record = {"generation_calls": 0}
original_generate = generation.HFGenerator.generate


def counted_generate(self, *args, **kwargs):
    record["generation_calls"] += 1
    return original_generate(self, *args, **kwargs)


generation.HFGenerator.generate = counted_generate


async def agent(client, prompt, **row):
    """A chat agent that asks ``1 + 2 * rank`` questions in one conversation."""
    messages = [{"role": "user", "content": prompt}]
    for _ in range(1 + 2 * rank):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": "and then?"}]
    return messages[-2]["content"]


def length_reward(completions, agent_output, **kwargs):
    return [float(len(out or "") % 5) for out in agent_output]


tokenizer = build_tokenizer()
if rank == 0 and not os.path.exists(os.path.join(model_dir, "config.json")):
    build_tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
args = agentic_args(type("P", (), {"__truediv__": lambda self, other: os.path.join(out_dir, other)})(),
                    per_device_train_batch_size=2, num_generations=2, max_steps=2, max_turns=4,
                    max_completion_length=96, max_tokens_per_turn=4)
rows = [{"prompt": row["prompt"]} for row in lookup_dataset(8)]
from datasets import Dataset  # noqa: E402

trainer = AgenticGRPOTrainer(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer, agent=agent)
trainer.train()
logs = [entry for entry in trainer.state.log_history if "agentic/mask_audit" in entry]
record["mask_audit"] = [entry["agentic/mask_audit"] for entry in logs]
record["turns_mean"] = [entry["agentic/turns_mean"] for entry in logs]
record["policy_checksum"] = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
trainer.end_training()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
