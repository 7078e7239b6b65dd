"""A trajectory of several segments yields several training rows: rewards and GRPO's group statistics stay per
trajectory, each row carries its trajectory's advantage, and the row count is equal on every process and divisible by
``steps_per_generation`` (padding rows train nothing)."""

from __future__ import annotations

import itertools

import pytest
import torch
from agent_helpers import add_dataset, config, scripted

from trl_agentic.agents.session import AgentTrajectory
from trl_agentic.algorithms.advantages import group_advantages
from trl_agentic.trainers.round import PADDING_ERROR, training_rows
from trl_agentic.trajectory import Trajectory


def test_layout_puts_each_segment_on_a_row_then_padding():
    a = AgentTrajectory(prompt_ids=[1], segments=[Trajectory(prompt_ids=[2]), Trajectory(prompt_ids=[3])])
    b = AgentTrajectory(prompt_ids=[4], segments=[])  # never called the model: itself, one row
    asked = []
    most = lambda n: asked.append(n) or 5  # noqa: E731 - another process has 5 rows
    rows, owners = training_rows([a, b], most, 2, token_id=0)
    assert asked == [3]  # this process's rows
    assert [r.prompt_ids for r in rows] == [[2], [3], [4], [0], [0], [0]] and owners == [0, 0, 1, -1, -1, -1]
    assert all(r.env_failed and r.error == PADDING_ERROR for r in rows[3:])


def rewriting_agent():
    """Every third run rewrites its history once (two segments); the others keep one."""
    runs = itertools.count()

    async def agent(client, question, **row):
        rewrite = next(runs) % 3 == 0  # agents start in row order: one run of each of the first two groups
        messages = [{"role": "user", "content": question}]
        r = await client.chat.completions.create(model="p", messages=messages)
        if rewrite:
            messages = [{"role": "user", "content": "Summary: " + question}]
            r = await client.chat.completions.create(model="p", messages=messages)
        return r.choices[0].message.content

    return agent


def segments_reward(trajectory, **kwargs):
    return [float(len(t.segments)) for t in trajectory]


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_segments_train_as_rows_with_their_trajectorys_advantage(qwen, tmp_path, trainer_name):
    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, ["Four."])
    kwargs = dict(model=model, processing_class=tok, train_dataset=add_dataset(8), reward_funcs=segments_reward,
                  agent=rewriting_agent())
    if trainer_name == "grpo":
        args = config(AgenticGRPOConfig, tmp_path, gradient_accumulation_steps=2, loss_type="grpo")
        trainer = AgenticGRPOTrainer(args=args, **kwargs)
    else:
        args = config(AgenticPPOConfig, tmp_path, gradient_accumulation_steps=2, beta=0.05)
        args.num_generations = 1
        trainer = AgenticPPOTrainer(args=args, **kwargs)
    rounds = []
    original = type(trainer).training_batch

    def keep(self, rows):
        batch = original(self, rows)
        rounds.append((self._last_round, batch))
        return batch

    generation_round = type(trainer).generation_round

    def remember(self, rows):
        self._last_round = generation_round(self, rows)
        return self._last_round

    trainer.training_batch = keep.__get__(trainer)
    trainer.generation_round = remember.__get__(trainer)
    trainer.train()
    assert trainer.state.global_step == 2 and rounds
    for round_, batch in rounds:
        runs, owners = round_.runs, round_.owners
        segments = sum(len(t.segments) for t in runs)
        assert len(runs) == 4 and batch.prompt_ids.size(0) == len(owners) == segments + (segments % 2)
        assert any(len(t.segments) == 2 for t in runs)
        padding = [i for i, o in enumerate(owners) if o < 0]
        assert all(batch.loss_mask[i].sum() == 0 for i in padding)
        assert torch.isnan(round_.rewards_per_func[padding]).all()
        if trainer_name == "grpo":  # groups of two runs, each run once, whatever its segment count
            per_run = group_advantages(round_.run_rewards, trainer.reward_weights, 2)
            expected = torch.stack([per_run[o] if o >= 0 else torch.tensor(0.0) for o in owners])
            assert torch.allclose(batch.advantages.cpu(), expected)
            assert per_run.abs().sum() > 0
        for row, o in enumerate(owners):  # every row trains its own segment's sampled tokens only
            if o >= 0:
                assert round_.trajectories[row] in runs[o].segments
