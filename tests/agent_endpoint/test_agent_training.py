"""Agents written with the OpenAI SDK train through AgenticGRPOTrainer and AgenticPPOTrainer unchanged: the ids the
endpoint returned are the ids recorded, which are the ids the generator sampled, and the mask audit is 0 (the
autouse fixture of tests/conftest.py fails any test that logs a non-zero audit)."""

from __future__ import annotations

import pytest
from agent_helpers import add_dataset, answer_reward, call, config, scripted, sdk_agent


class Recording:
    """Wraps a generator and keeps the ids of every output it returned."""

    def __init__(self, inner):
        self.inner, self.outputs = inner, []

    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        out = self.inner.generate(prompts, max_new_tokens, stop_strings, eos_token_ids)
        self.outputs.append([list(g.ids) for g in out])
        return out


def recorded_generator(trainer):
    """Wrap the trainer's generator (built once, at construction) so that every generated output is kept (the
    reference of token exactness)."""
    trainer.generator = Recording(trainer.generator)
    return [trainer.generator]


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_sdk_agent_trains_two_steps(qwen, tmp_path, trainer_name):
    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, [call("add", a=1, b=3), "The answer is 4."])
    if trainer_name == "grpo":
        trainer = AgenticGRPOTrainer(model=model, processing_class=tok, train_dataset=add_dataset(),
                                     reward_funcs=answer_reward, args=config(AgenticGRPOConfig, tmp_path),
                                     agent=sdk_agent)
    else:
        args = config(AgenticPPOConfig, tmp_path, beta=0.05)
        args.num_generations = 1
        trainer = AgenticPPOTrainer(model=model, processing_class=tok, train_dataset=add_dataset(),
                                    reward_funcs=answer_reward, args=args, agent=sdk_agent)
    recordings = recorded_generator(trainer)
    seen = []
    original_round = type(trainer).generation_round

    def keep(self, rows):
        round_ = original_round(self, rows)
        seen.append(round_)
        return round_

    trainer.generation_round = keep.__get__(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    generated = [ids for rec in recordings for call_ in rec.outputs for ids in call_]
    for round_ in seen:
        for t in round_.runs:
            assert t.stop_reason == "terminated" and len(t.segments) == 1 and t.requests == 2
            for ids, raw in zip(t.agent_segments(), t.generated_ids):
                assert raw in generated and ids == raw[: len(ids)]
    rewards = [e["rewards/answer_reward/mean"] for e in trainer.state.log_history if "rewards/answer_reward/mean" in e]
    assert len(rewards) == 2 and all(r >= 0 for r in rewards)
    logged = {k for e in trainer.state.log_history for k in e}
    assert "agentic/mask_audit" in logged and "agentic/agent/segments_per_trajectory" in logged
