"""Short learning checks on the toy tool task (kept small for CI) and the toy reward itself."""

import pytest
from helpers import agentic_args, lookup_dataset

from trl_agentic import AgenticGRPOTrainer, Trajectory
from trl_agentic.toy import LookupEnvironment, lookup_reward


def test_lookup_reward_milestones():
    def traj(*actions):
        return Trajectory(prompt_ids=[1], actions=list(actions))

    cases = [
        (traj("hello"), 0.0),
        (traj("<lookup>k1"), 0.0),  # incomplete call
        (traj("<lookup>k1</lookup>", "text"), 0.2),
        (traj("<lookup>k1</lookup>", "<answer>3"), 0.3),
        (traj("<lookup>k1</lookup>", "<answer>3</answer>"), 0.5),
        (traj("<lookup>k1</lookup>", "<answer>7</answer>"), 1.0),
        (traj("<answer>7</answer>"), 0.0),  # answering without the tool earns nothing
    ]
    rewards = lookup_reward([""] * len(cases), value=["7"] * len(cases), trajectory=[t for t, _ in cases])
    assert rewards == pytest.approx([r for _, r in cases])


def test_grpo_reward_rises_on_toy_tool_task(tiny_model_dir, tokenizer, tmp_path):
    """The agent learns to open a tool call: mean reward of the last 5 steps clearly above the first 5."""

    def calls_lookup(completions, trajectory, **kwargs):
        return [float("<lookup>" in t.actions[0]) for t in trajectory]

    args = agentic_args(tmp_path, max_steps=20, per_device_train_batch_size=32, num_generations=8,
                        learning_rate=3e-3, lr_scheduler_type="constant", max_turns=1, max_completion_length=12)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=calls_lookup, args=args,
                                 train_dataset=lookup_dataset(256), processing_class=tokenizer,
                                 environment=LookupEnvironment)
    trainer.train()
    reward = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    assert sum(reward[-5:]) / 5 > sum(reward[:5]) / 5 + 0.2, reward
