"""Groups with equal rewards: detection, std floor, dynamic sampling (bounded, group structure kept)."""

import pytest
import torch

from helpers import EchoEnvironment, agentic_args, lookup_dataset
from trl_agentic import AgenticGRPOTrainer
from trl_agentic.algorithms.advantages import zero_std_groups
from trl_agentic.compat import TRLBatch
from trl_agentic.trainers.zero_variance import merge_rounds, pick_groups


def test_zero_std_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5000001])
    assert zero_std_groups(rewards, 2).tolist() == [True, False, True]


def test_pick_groups_prefers_kept_then_fills_with_dropped():
    keeps = [torch.tensor([False, True, False]), torch.tensor([True, False, False])]
    assert pick_groups(keeps, 3) == [(0, 1), (1, 0), (0, 0)]
    assert pick_groups([torch.tensor([True, True])], 2) == [(0, 0), (0, 1)]


def test_merge_rounds_keeps_groups_and_pads():
    def batch(width_p, width_c, offset):
        return {
            "prompt_ids": torch.full((4, width_p), offset), "prompt_mask": torch.ones(4, width_p, dtype=torch.long),
            "completion_ids": torch.arange(4).unsqueeze(1).repeat(1, width_c) + offset,
            "completion_mask": torch.ones(4, width_c, dtype=torch.long), "advantages": torch.arange(4.0) + offset,
            "num_items_in_batch": torch.tensor(0),
        }

    rounds = [TRLBatch(batch(2, 3, 0)), TRLBatch(batch(3, 5, 100))]
    merged = merge_rounds(rounds, [(1, 1), (0, 0)], 2, gather=lambda x: x, max_width=lambda w: w,
                          process_index=0, pad_token_id=-1).data
    assert merged["advantages"].tolist() == [102.0, 103.0, 0.0, 1.0]  # group 1 of round 1, then group 0 of round 0
    assert merged["prompt_ids"][2].tolist() == [-1, 0, 0]  # prompts left-padded
    assert merged["completion_ids"][2].tolist() == [0, 0, 0, -1, -1]  # completions right-padded
    assert merged["completion_mask"][2].tolist() == [1, 1, 1, 0, 0]
    assert merged["num_items_in_batch"].item() == 5 + 5 + 3 + 3


def _constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def test_dynamic_sampling_never_loops_forever(tiny_model_dir, tokenizer, tmp_path):
    args = agentic_args(tmp_path, zero_variance_groups="dynamic_sampling", max_extra_generation_rounds=2, max_steps=1)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=_constant_reward, args=args,
                                 train_dataset=lookup_dataset(16), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=1))
    trainer.train()
    row = trainer.state.log_history[0]
    assert row["agentic/zero_variance/extra_rounds"] == 2
    assert row["agentic/zero_variance/dropped_groups"] == 6  # 2 groups per round, 3 rounds
    assert row["agentic/zero_variance/shortfall_groups"] == 2


def test_dynamic_sampling_replaces_dropped_groups(tiny_model_dir, tokenizer, tmp_path):
    def first_token_parity(completions, completion_ids, **kwargs):
        return [float(ids[0] % 2) for ids in completion_ids]

    args = agentic_args(tmp_path, zero_variance_groups="dynamic_sampling", max_extra_generation_rounds=6,
                        per_device_train_batch_size=8, num_generations=2, max_steps=1)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=first_token_parity, args=args,
                                 train_dataset=lookup_dataset(16), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=1))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [trainer.train_dataset[i // 2] for i in range(8)]
    batch = trainer._generate_and_score_completions(rows)
    # every group in the final batch has a non-zero advantage spread: +a, -a
    adv = batch["advantages"].view(-1, 2)
    assert (adv.abs() > 0).all() and torch.allclose(adv.sum(1), torch.zeros(4), atol=1e-5)
    mask = batch["completion_mask"] * batch["tool_mask"]
    assert batch["num_items_in_batch"].item() == mask.sum().item()


def test_std_floor_needs_group_scaling(tmp_path):
    with pytest.raises(ValueError, match="std_floor"):
        agentic_args(tmp_path, zero_variance_groups="std_floor", scale_rewards="batch")


def test_std_floor_follows_trls_aggregation_and_leaves_unscorable_rows_at_zero(tiny_model_dir, tokenizer, tmp_path):
    """Before: the floored advantages were rebuilt from summed rewards, ignoring multi_objective_aggregation, and an
    unscorable (all-None) row got a non-zero advantage."""
    from trl_agentic.algorithms.advantages import group_advantages

    def sometimes_none(completions, trajectory, **kwargs):
        return [None if i == 0 else float(t.num_agent_tokens % 4) for i, t in enumerate(trajectory)]

    def other(completions, trajectory, **kwargs):
        return [None if i == 0 else float(len(t.actions[0]) % 3) for i, t in enumerate(trajectory)]

    args = agentic_args(tmp_path, zero_variance_groups="std_floor", std_floor=0.5,
                        multi_objective_aggregation="normalize_then_sum", per_device_train_batch_size=8,
                        num_generations=4)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[sometimes_none, other], args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=2))
    trainer.model.train()
    rows = [trainer.train_dataset[i // 4] for i in range(8)]
    original = trainer.score_round
    captured = {}

    def keep(rows):
        captured["scored"] = original(rows)
        return captured["scored"]

    trainer.score_round = keep
    batch = trainer.training_batch(rows)
    scored = captured["scored"]
    expected = group_advantages(scored.rewards_per_func, trainer.reward_weights, 4, "normalize_then_sum", "group", 0.5)
    torch.testing.assert_close(batch.advantages, expected)
    assert batch.advantages[0] == 0
