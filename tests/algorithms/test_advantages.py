"""Group advantages: TRL's computation number for number (floor 0), the std floor, unscorable rows."""

import torch
from helpers import lookup_dataset

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


def test_equals_trls_advantages_and_frac_reward_zero_std(tiny_model_dir, tokenizer, tmp_path):
    """With std_floor=0 group_advantages reproduces the advantages TRL's own GRPOTrainer computes, and
    frac_reward_zero_std the metric TRL logs, for every aggregation and scale_rewards, on rewards with unscorable
    rows, a function's None and a group without spread (TRL fed fixed tokens through its rollout_func)."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic.algorithms.advantages import frac_reward_zero_std

    nan = float("nan")
    table = torch.tensor([[1.0, nan], [0.0, 2.0], [2.0, 1.0], [nan, nan],  # group 0
                          [1.0, 1.0], [1.0, 1.0], [1.0, nan], [1.0, 1.0],  # group 1: no spread
                          [3.0, 0.0], [nan, 4.0], [0.5, 0.5], [2.0, 1.0]])  # group 2
    funcs = [lambda completions, k=k, **kw: [None if torch.isnan(v) else float(v) for v in table[:, k]]
             for k in range(2)]

    def fixed_tokens(prompts, trainer):
        return {"prompt_ids": [[5, 6]] * len(prompts), "completion_ids": [[7, 8, 9]] * len(prompts), "logprobs": None}

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=12, num_generations=4,
                      reward_weights=[1.0, 0.5], use_cpu=True, bf16=False, report_to="none", max_completion_length=8)
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=funcs, args=args, processing_class=tokenizer,
                          train_dataset=lookup_dataset(12), rollout_func=fixed_tokens)
    trainer.model.train()
    rows = [{"prompt": "p"}] * 12
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        for scale_rewards in ("group", "batch", "none"):
            trainer.multi_objective_aggregation, trainer.scale_rewards = aggregation, scale_rewards
            expected = trainer._generate_and_score_completions([dict(r) for r in rows])["advantages"]
            ours = group_advantages(table, trainer.reward_weights, 4, aggregation, scale_rewards)
            assert expected.ne(0).any()
            torch.testing.assert_close(ours, expected, rtol=0, atol=0, msg=f"{aggregation}, {scale_rewards}")
            frac = frac_reward_zero_std(table, trainer.reward_weights, 4, aggregation, scale_rewards)
            assert frac == trainer._metrics["train"]["frac_reward_zero_std"][-1], (aggregation, scale_rewards)
