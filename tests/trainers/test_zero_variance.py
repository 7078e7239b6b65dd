"""Groups with equal rewards: detection, std floor, dynamic sampling (bounded, group structure kept)."""

import pytest
import torch
from helpers import EchoEnvironment, agentic_args, lookup_dataset

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.algorithms.advantages import zero_std_groups
from trl_agentic.compat import TRLBatch
from trl_agentic.trainers.zero_variance import merge_rounds, pick_groups


def test_zero_std_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    assert zero_std_groups(rewards, 2).tolist() == [True, False, True]


def test_zero_std_groups_skips_unscorable_members():
    """Defect: a group [1, None, 1, 1] counted its unscorable member as 0 and looked informative. NaN (unscorable)
    members are left out, as TRL's ``frac_reward_zero_std``; a group with fewer than two scorable members has no
    spread either."""
    nan = float("nan")
    rewards = torch.tensor([1.0, nan, 1.0, 1.0, 0.0, 1.0, nan, nan, nan, nan, nan, 2.0])
    assert zero_std_groups(rewards, 4).tolist() == [True, False, True]


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


def _dynamic_sampling_trainer(tiny_model_dir, tokenizer, tmp_path, reward, extra_rounds, group):
    args = agentic_args(tmp_path, zero_variance_groups="dynamic_sampling", max_extra_generation_rounds=extra_rounds,
                        per_device_train_batch_size=8, num_generations=group, max_steps=1)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=reward, args=args,
                                 train_dataset=lookup_dataset(16), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=1))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def test_dynamic_sampling_replaces_dropped_groups(tiny_model_dir, tokenizer, tmp_path):
    def first_token_parity(completions, completion_ids, **kwargs):
        return [float(ids[0] % 2) for ids in completion_ids]

    trainer = _dynamic_sampling_trainer(tiny_model_dir, tokenizer, tmp_path, first_token_parity, 6, 2)
    rows = [trainer.train_dataset[i // 2] for i in range(8)]
    batch = trainer._generate_and_score_completions(rows)
    # every group in the final batch has a non-zero advantage spread: +a, -a
    adv = batch["advantages"].view(-1, 2)
    assert (adv.abs() > 0).all() and torch.allclose(adv.sum(1), torch.zeros(4), atol=1e-5)
    mask = batch["completion_mask"] * batch["tool_mask"]
    assert batch["num_items_in_batch"].item() == mask.sum().item()


def test_dynamic_sampling_drops_a_group_whose_only_spread_is_an_unscorable_member(tiny_model_dir, tokenizer,
                                                                                  tmp_path):
    """Defect: the group [1, None, 1, 1] was kept (its None counted as 0). Group 0 of every round is such a group,
    group 1 has a spread: one group dropped per round, both rounds."""

    def by_position(completions, **kwargs):
        return [None if i == 1 else (1.0 if i < 4 else float(i % 2)) for i in range(len(completions))]

    trainer = _dynamic_sampling_trainer(tiny_model_dir, tokenizer, tmp_path, by_position, 1, 4)
    trainer._generate_and_score_completions([trainer.train_dataset[i // 4] for i in range(8)])
    metrics = trainer._metrics["train"]
    assert metrics["agentic/zero_variance/dropped_groups"] == [2.0]
    assert metrics["agentic/zero_variance/extra_rounds"] == [1.0]


def test_std_floor_in_evaluation_groups_by_num_generations_eval(tiny_model_dir, tokenizer, tmp_path):
    """Defect: evaluation grouped by num_generations (2) instead of num_generations_eval (3): an eval batch of 3
    raised "shape '[-1, 2]' is invalid". Expected advantages computed by hand: rewards (0, 1, 3), mean 4/3,
    unbiased std sqrt(7/3) > std_floor."""

    def by_position(completions, **kwargs):
        return [(0.0, 1.0, 3.0)[i % 3] for i in range(len(completions))]

    args = agentic_args(tmp_path, zero_variance_groups="std_floor", std_floor=0.1, num_generations=2,
                        num_generations_eval=3, per_device_eval_batch_size=3)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=by_position, args=args,
                                 train_dataset=lookup_dataset(8), eval_dataset=lookup_dataset(3),
                                 processing_class=tokenizer, environment=lambda: EchoEnvironment(turns=1))
    trainer.model.eval()
    batch = trainer.training_batch([trainer.eval_dataset[0]] * 3)
    std = (7 / 3) ** 0.5
    expected = torch.tensor([(r - 4 / 3) / (std + 1e-4) for r in (0.0, 1.0, 3.0)])
    torch.testing.assert_close(batch.advantages, expected)


def test_std_floor_needs_group_scaling(tmp_path):
    with pytest.raises(ValueError, match="std_floor"):
        agentic_args(tmp_path, zero_variance_groups="std_floor", scale_rewards="batch")


def test_std_floor_follows_trls_aggregation_and_leaves_unscorable_rows_at_zero(tiny_model_dir, tokenizer, tmp_path):
    """Before: the floored advantages were rebuilt from summed rewards, ignoring multi_objective_aggregation, and an
    unscorable (all-None) row got a non-zero advantage. Expected values from a plain loop (GDPO: each function
    normalised in its group with the floor, weighted sum, then normalised over the batch), not from the library."""
    import statistics

    a = [None, 1.0, 1.0, 1.02, 0.0, 2.0, 1.0, 1.0]
    b = [None, 0.0, 3.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    weights = [1.0, 0.5]

    def reward_a(completions, **kwargs):
        return a[: len(completions)]

    def reward_b(completions, **kwargs):
        return b[: len(completions)]

    args = agentic_args(tmp_path, zero_variance_groups="std_floor", std_floor=0.5, reward_weights=weights,
                        multi_objective_aggregation="normalize_then_sum", per_device_train_batch_size=8,
                        num_generations=4)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[reward_a, reward_b], args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=2))
    trainer.model.train()
    batch = trainer.training_batch([trainer.train_dataset[i // 4] for i in range(8)])

    def normalised(values):  # one function, one group: (x - mean) / (max(std, floor) + 1e-4), None skipped
        present = [v for v in values if v is not None]
        mean, std = statistics.mean(present), statistics.stdev(present)
        return [None if v is None else (v - mean) / (max(std, 0.5) + 1e-4) for v in values]

    z = [normalised(f[g : g + 4]) for f in (a, b) for g in (0, 4)]
    za, zb = z[0] + z[1], z[2] + z[3]
    total = [None if x is None and y is None else weights[0] * (x or 0.0) + weights[1] * (y or 0.0)
             for x, y in zip(za, zb)]
    present = [t for t in total if t is not None]
    mean, std = statistics.mean(present), statistics.stdev(present)
    expected = torch.tensor([0.0 if t is None else (t - mean) / (std + 1e-4) for t in total])
    torch.testing.assert_close(batch.advantages, expected)
    assert batch.advantages[0] == 0


def test_zero_variance_policies_without_an_environment_are_refused(tiny_model_dir, tokenizer, tmp_path):
    """Without environment= the trainer is TRL's GRPOTrainer, whose round knows no zero-variance policy: refuse
    the setting rather than ignore it."""
    for policy in ("std_floor", "dynamic_sampling"):
        with pytest.raises(ValueError, match="zero_variance_groups applies to environment rollouts"):
            AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                               args=agentic_args(tmp_path, zero_variance_groups=policy),
                               train_dataset=lookup_dataset(8), processing_class=tokenizer)
