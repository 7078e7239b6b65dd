"""Our side of the vLLM contract, with a stand-in for TRL's VLLMGeneration that records calls.

What TRL's vLLM backend needs from a multi-turn rollout: per-turn ``max_tokens`` and ``stop`` strings reach
SamplingParams (through ``generation_kwargs``), TRL's own settings are restored afterwards, weights are synced once
per training step (not once per turn), and every turn is one batched call. A real vLLM engine runs in tests/vllm_engine/ (marker ``vllm``).
"""

import pytest
from helpers import EchoEnvironment, agentic_args, lookup_dataset

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.rollout.vllm import TRLVLLMGenerator
from trl_agentic.toy import lookup_reward


class FakeVLLMGeneration:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.max_completion_length = 999
        self.generation_kwargs = {"seed": 1}
        self.calls, self.syncs = [], 0

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations):
        self.calls.append({"n": len(prompts), "max_tokens": self.max_completion_length,
                           "kwargs": dict(self.generation_kwargs), "num_generations": num_generations})
        ids = self.tokenizer("act", add_special_tokens=False)["input_ids"]
        return prompts, [ids for _ in prompts], [[[-0.1] for _ in ids] for _ in prompts], None


def test_generator_sets_and_restores_vllm_settings(tokenizer):
    fake = FakeVLLMGeneration(tokenizer)
    gen = TRLVLLMGenerator(type("T", (), {"vllm_generation": fake})())
    out = gen.generate([[1, 2], [3]], 7, ["</search>"], [5, 6])
    assert fake.calls[0]["max_tokens"] == 7 and fake.calls[0]["num_generations"] == 1
    assert fake.calls[0]["kwargs"] == {"seed": 1, "stop": ["</search>"], "include_stop_str_in_output": True,
                                       "stop_token_ids": [5, 6]}
    assert fake.max_completion_length == 999 and fake.generation_kwargs == {"seed": 1}
    assert out[0].logprobs == [-0.1] * len(out[0].ids)


def test_trainer_uses_vllm_seam_once_per_turn_and_syncs_once_per_step(tiny_model_dir, tokenizer, tmp_path):
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward,
                                 args=agentic_args(tmp_path, max_turns=3, max_completion_length=64),
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=3))
    fake = FakeVLLMGeneration(tokenizer)
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, fake, -1
    trainer.rollout_seam.engine.generator = TRLVLLMGenerator(trainer)  # the generator is built once, at construction
    trainer.vllm_importance_sampling_correction = True
    trainer.model.train()
    logged = {}
    trainer.add_metrics = lambda metrics: [logged.setdefault(name, value) for name, value in metrics.items()]
    batch = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in range(4)])
    assert fake.syncs == 1  # TRL's _generate syncs before our rollout, once per step
    assert [c["n"] for c in fake.calls] == [4, 4, 4]  # one batched call per turn
    assert all(c["max_tokens"] == 12 for c in fake.calls)
    assert "sampling_per_token_logps" in batch  # vLLM logprobs reach TRL (for importance sampling)
    # the fake samples every token at log-prob -0.1: the gap is |logp_trainer + 0.1| over agent tokens only
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    expected = (batch["old_per_token_logps"] + 0.1).abs()[mask]
    assert abs(logged["agentic/vllm_logprob_gap"] - expected.mean().item()) < 1e-5
    assert abs(logged["agentic/vllm_logprob_gap_max"] - expected.max().item()) < 1e-5


def test_sleep_mode_with_several_turns_warns_about_the_per_turn_cost(tmp_path):
    with pytest.warns(UserWarning, match="each turn of a multi-turn rollout pushes the weights again"):
        agentic_args(tmp_path, use_vllm=True, vllm_enable_sleep_mode=True, max_turns=3)
