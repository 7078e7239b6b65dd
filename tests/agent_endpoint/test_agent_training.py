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
    trainer.rollout_seam.generator = Recording(trainer.rollout_seam.generator)
    return [trainer.rollout_seam.generator]


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


@pytest.mark.parametrize("agent_catches", [False, True])
def test_every_request_refused_stops_the_run_at_the_first_round(tiny_model_dir, tmp_path, agent_catches):
    """Tools with a chat template that has no response template (the tests' ChatML tokenizer): the endpoint answers
    every request 400. Whether the agent raises (every run env_error) or catches the error and returns (every run
    scorable, at reward 0), the run stops at its first round with the endpoint's message: not after
    max_degenerate_steps rounds, nor never."""
    import openai
    from agent_helpers import TOOLS
    from transformers import AutoTokenizer

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer
    from trl_agentic.trainers.checks import DegenerateTrainingError

    async def agent(client, question, **row):
        try:
            await client.chat.completions.create(model="policy", tools=TOOLS,
                                                 messages=[{"role": "user", "content": question}])
        except openai.BadRequestError:
            if not agent_catches:
                raise
        return ""

    trainer = AgenticGRPOTrainer(model=tiny_model_dir, processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                                 train_dataset=add_dataset(), reward_funcs=answer_reward, agent=agent,
                                 args=config(AgenticGRPOConfig, tmp_path, max_steps=5))
    with pytest.raises(DegenerateTrainingError, match=r"stopped at the first generation round: the endpoint refused "
                       r"every request of every agent \(2 answered 400, none reached the model\), e\.g\. native tool "
                       r"calls need a response template"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_a_round_with_a_model_call_is_not_stopped_by_refusals():
    """One request refused beside one that reached the model, or refusals with the check off: the run goes on."""
    from trl_agentic.trainers.run_health import RunHealth

    def stop(max_degenerate_steps, reached_model, refused, refusal):
        sums = {"count": 2, "reached_model": reached_model, "refused": refused}
        return RunHealth(0, "", max_degenerate_steps, None).observe("step 1", sums, [], refusal, False, {})[1]

    assert stop(3, 1, 5, "bad") is None
    assert stop(0, 0, 5, "bad") is None
    assert stop(3, 0, 0, None) is None
    assert "e.g. bad;" in stop(3, 0, 5, "bad")
