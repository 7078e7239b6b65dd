"""Group advantages: TRL's computation number for number (floor 0), the std floor, unscorable rows."""

import pytest
import torch

from helpers import EchoEnvironment, agentic_args, lookup_dataset
from trl_agentic.algorithms.advantages import group_advantages


def test_std_floor_keeps_tiny_spreads_small():
    rewards = torch.tensor([[0.0], [0.02], [0.0], [1.0]])
    adv = group_advantages(rewards, torch.ones(1), 2, std_floor=0.5)
    torch.testing.assert_close(adv[:2], torch.tensor([-0.01, 0.01]) / (0.5 + 1e-4))  # not blown up to +-0.7
    std = torch.tensor([0.0, 1.0]).std()
    torch.testing.assert_close(adv[2:], torch.tensor([-0.5, 0.5]) / (std + 1e-4))


def test_unscorable_rows_get_zero_and_stay_out_of_the_baseline():
    nan = float("nan")
    rewards = torch.tensor([[1.0, nan], [nan, nan], [0.0, 2.0], [1.0, 1.0]])
    adv = group_advantages(rewards, torch.tensor([1.0, 0.5]), 2)
    assert adv[1] == 0  # unscorable
    assert adv[0] == 0  # alone in its group once the unscorable row is out: no spread
    assert adv[2] < 0 < adv[3]


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_equals_trls_advantages(tiny_model_dir, tokenizer, tmp_path, aggregation, scale_rewards):
    """With std_floor=0 the function reproduces the advantages TRL computed for a real batch."""
    from trl_agentic import AgenticGRPOTrainer

    def parity(completions, trajectory, **kwargs):
        return [float(t.num_agent_tokens % 3) for t in trajectory]

    def half_missing(completions, trajectory, **kwargs):
        return [None if i % 3 == 0 else float(len(t.actions[0]) % 5) for i, t in enumerate(trajectory)]

    args = agentic_args(tmp_path, multi_objective_aggregation=aggregation, scale_rewards=scale_rewards,
                        per_device_train_batch_size=8, num_generations=4, reward_weights=[1.0, 0.5])
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[parity, half_missing], args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=2))
    trainer.model.train()
    scored = trainer.score_round([trainer.train_dataset[i // 4] for i in range(8)])
    ours = group_advantages(scored.rewards_per_func, trainer.reward_weights, 4, aggregation, scale_rewards)
    torch.testing.assert_close(ours, scored.batch.advantages, rtol=0, atol=0)
