"""Both trainers in TRL's colocate mode on a real vLLM engine: the rollouts are token-exact (the mask audit, autouse
in tests/conftest.py, fails any step with a trained token vLLM did not sample), vLLM's sampling log-probs reach
TRL's importance-sampling correction, and the weights reach vLLM after every optimizer step: the gap between the
trainer's and vLLM's log-probs of the sampled tokens stays far below how much one step moved the model."""

import pytest
import torch
from helpers import Drift, EchoEnvironment, agentic_args, lookup_dataset, ppo_args

from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer

pytestmark = pytest.mark.vllm


CASES = {
    "grpo": (AgenticGRPOTrainer, agentic_args, False),
    "grpo-lora": (AgenticGRPOTrainer, agentic_args, True),
    "ppo": (AgenticPPOTrainer, ppo_args, False),
    "ppo-lora": (AgenticPPOTrainer, ppo_args, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_colocate_training_syncs_weights_every_step(case, vllm_model_dir, tokenizer, tmp_path, in_process_rank):
    trainer_class, make_args, lora = CASES[case]
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    args = make_args(tmp_path, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                     vllm_max_model_length=256, max_steps=2, learning_rate=3e-2 if lora else 1e-2,
                     vllm_importance_sampling_correction=True)
    drift = Drift(torch.tensor([tokenizer("find key k12 <lookup>k12</lookup> 7 answer", add_special_tokens=False)
                                ["input_ids"]]))
    trainer = trainer_class(model=vllm_model_dir, args=args, train_dataset=lookup_dataset(8),
                            processing_class=tokenizer, reward_funcs=lambda completions, **_: [
                                float(len(c)) / 50 for c in completions],
                            environment=lambda: EchoEnvironment(turns=2), peft_config=peft_config,
                            callbacks=[drift])
    # TRL leaves vLLM's default on: the turns of a rollout share the prefix cache (reset once per step, at the sync)
    assert trainer.vllm_generation.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "agentic/vllm_logprob_gap" in entry]
    assert [entry["agentic/mask_audit"] for entry in logs] == [0.0, 0.0]
    gap_after_step_1 = logs[1]["agentic/vllm_logprob_gap"]
    print(f"{case}: drift {drift.after_step}, gap {[(e['agentic/vllm_logprob_gap'], e['agentic/vllm_logprob_gap_max']) for e in logs]}, "
          f"IS {[e['sampling/importance_sampling_ratio/mean'] for e in logs]}")
    # step 2 sampled with the weights after step 1: had they not been synced, the gap would be about the drift
    assert drift.after_step[1] > 10 * gap_after_step_1, (drift.after_step, [e["agentic/vllm_logprob_gap"] for e in logs])
    assert all(0.5 < entry["sampling/importance_sampling_ratio/mean"] < 2.0 for entry in logs)


async def chat_agent(client, prompt, **row):
    """Two model calls in one conversation, through the trajectory's endpoint."""
    messages = [{"role": "user", "content": prompt}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": "again"}]
    return messages[-2]["content"]


def test_an_agent_trains_on_vllm_generation(vllm_model_dir, tokenizer, tmp_path, in_process_rank):
    """``agent=`` with TRL's colocate vLLM as the policy behind the endpoint: every request of the round is generated
    by vLLM (its sampling log-probs reach the batch), the recorded turns are what vLLM sampled (mask audit 0), and the
    weights reach vLLM after the optimizer step."""
    from datasets import Dataset

    args = agentic_args(tmp_path, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                        vllm_max_model_length=256, max_steps=2, learning_rate=1e-2, max_turns=4,
                        max_completion_length=96, max_tokens_per_turn=6, vllm_importance_sampling_correction=True)
    rows = Dataset.from_list([{"prompt": row["prompt"]} for row in lookup_dataset(8)])
    trainer = AgenticGRPOTrainer(model=vllm_model_dir, args=args, train_dataset=rows, processing_class=tokenizer,
                                 reward_funcs=lambda completions, agent_output, **_: [
                                     float(len(out or "")) / 20 for out in agent_output],
                                 agent=chat_agent)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "agentic/vllm_logprob_gap" in entry]
    assert [entry["agentic/mask_audit"] for entry in logs] == [0.0, 0.0]
    assert [entry["agentic/turns_mean"] for entry in logs] == [2.0, 2.0]
    assert all(entry["agentic/vllm_logprob_gap"] < 0.05 for entry in logs)  # vLLM sampled what the trainer scores
    assert all(0.5 < entry["sampling/importance_sampling_ratio/mean"] < 2.0 for entry in logs)
