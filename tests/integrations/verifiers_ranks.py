"""Run under ``accelerate launch --num_processes 2`` (tests/integrations/test_verifiers.py): the tiny-arith verifiers
environment trained with AgenticGRPOTrainer on two processes, each process's episodes against its own endpoint, the
model's turns scripted (a call to `add`, then the answer 4).

Writes ``<out>/rank<k>.json``: each run's stop reason, segments, requests, reward and the reward its row should have,
the mask audits logged, and a checksum of the policy after training.
"""

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "envs" / "tiny_arith")]

import helpers  # noqa: E402
from helpers import native_call, scripted  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer  # noqa: E402
from trl_agentic.integrations.verifiers import VerifiersEnvironment  # noqa: E402


class ScriptedOrDummy(helpers.ScriptedLogits):
    """The script's turns; a row without an assistant header (the one-token dummy a process generates while the other
    still has agents running) is left to the model."""

    def __call__(self, input_ids, scores):
        n = len(self.header)
        rows = [any(ids[i:i + n] == self.header for i in range(len(ids) - n + 1)) for ids in input_ids.tolist()]
        if all(rows):
            return super().__call__(input_ids, scores)
        out = scores.clone()
        if any(rows):
            keep = [i for i, has in enumerate(rows) if has]
            out[keep] = super().__call__(input_ids[keep], scores[keep])
        return out


helpers.ScriptedLogits = ScriptedOrDummy
out_dir, model_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))
env = VerifiersEnvironment.load("tiny-arith", config={"agent": {"runtime": {"type": "subprocess"}},
                                                      "taskset": {"num_tasks": 8}})
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = scripted(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer,
                 [native_call("add", a=1, b=3), "The answer is 4."])
args = AgenticGRPOConfig(output_dir=os.path.join(out_dir, "out"), per_device_train_batch_size=2, num_generations=2,
                         max_completion_length=128, max_tokens_per_turn=64, max_turns=4, max_steps=2,
                         learning_rate=1e-3, report_to="none", use_cpu=True, bf16=False, seed=0, save_strategy="no",
                         logging_steps=1)
trainer = AgenticGRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=env.dataset(),
                             reward_funcs=env.reward, agent=env.agent)
runs, original = [], type(trainer).generation_round


def keep(self, rows):
    round_ = original(self, rows)
    for run, row, reward in zip(round_.runs, round_.rows, round_.run_rewards[:, 0].tolist()):
        runs.append({"stop_reason": run.stop_reason, "segments": len(run.segments), "requests": run.requests,
                     "answer": json.loads(row["verifiers_task"])["answer"], "error": run.error,
                     "episode_reward": getattr(run.agent_output, "reward", None)})
    return round_


trainer.generation_round = keep.__get__(trainer)
trainer.train()
record = {"runs": runs, "steps": trainer.state.global_step,
          "mask_audit": [e["agentic/mask_audit"] for e in trainer.state.log_history if "agentic/mask_audit" in e],
          "policy_checksum": float(sum(p.detach().double().sum() for p in trainer.model.parameters()))}
trainer.end_training()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
