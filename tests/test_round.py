"""Contract: with an environment, AgenticGRPOTrainer's own generation round (rollout -> TRL's reward functions ->
group advantages -> batch) equals what TRL 1.16's GRPOTrainer builds from the same token streams handed to it
through its ``rollout_func`` (``helpers.trl_replay``): every batch tensor, the rewards, TRL's per-round metrics and
its completions table."""

import math

import pytest
import torch
from helpers import EchoEnvironment, agentic_args, lookup_dataset, trl_replay

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.algorithms.importance import vllm_importance_sampling_ratio
from trl_agentic.trainers.round import pad

CASES = {
    "ref-and-old-logps": dict(beta=0.1, num_iterations=2),
    "chat-gdpo-batch": dict(rollout_mode="chat", multi_objective_aggregation="normalize_then_sum",
                            scale_rewards="batch", pad_to_multiple_of=8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_round_equals_trls_on_the_same_trajectories(tiny_model_dir, tokenizer, tmp_path, case):
    overrides = CASES[case]
    conversational = overrides.get("rollout_mode") == "chat"
    seen = {}

    def turns(completions, trajectory, log_metric, log_extra, **kwargs):  # depends on the text and the trajectory
        seen.setdefault(id(log_metric), list(trajectory))
        log_metric("custom/turns", float(sum(t.num_turns for t in trajectory)))
        log_extra("custom_column", [t.num_turns for t in trajectory])
        return [None if i == 1 else float(t.num_turns + len(str(c)) % 3) for i, (c, t) in
                enumerate(zip(completions, trajectory))]

    def agent_tokens(completions, trajectory, **kwargs):
        return [float(t.num_agent_tokens % 4) for t in trajectory]

    args = agentic_args(tmp_path, per_device_train_batch_size=8, num_generations=4, reward_weights=[1.0, 0.5],
                        log_completions=True, **overrides)
    ours = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[turns, agent_tokens], args=args,
                              train_dataset=lookup_dataset(8, conversational=conversational),
                              processing_class=tokenizer, environment=lambda: EchoEnvironment(turns=2))
    ours.model.train()
    rows = [ours.train_dataset[i // 4] for i in range(8)]
    batch = ours.training_batch([dict(r) for r in rows]).data
    trajectories = next(iter(seen.values()))
    assert len({t.num_turns for t in trajectories}) > 1 or len({t.num_agent_tokens for t in trajectories}) > 1
    trl, expected = trl_replay(tiny_model_dir, tokenizer, args, [turns, agent_tokens], trajectories, rows)

    assert list(batch) == list(expected)  # the same keys, in TRL's order (its shuffle reads the first value)
    for key, value in expected.items():
        if value.dtype.is_floating_point:
            torch.testing.assert_close(batch[key], value, rtol=0, atol=0, msg=key)
        else:
            assert torch.equal(batch[key], value), key
    assert (batch["tool_mask"] == 0).any() and batch["advantages"].ne(0).any()
    if overrides.get("beta"):
        assert "ref_per_token_logps" in batch and "old_per_token_logps" in batch

    for name, values in trl._metrics["train"].items():
        if name == "completions/clipped_ratio" or "terminated_length" in name:
            continue  # ours: the trajectory was cut by a budget; TRL's: the last token is no end id (below)
        assert ours._metrics["train"][name] == pytest.approx(values, nan_ok=True), name
    ended = [t for t in trajectories if not t.truncated]
    assert ended, "no trajectory ended on its own: the check below would prove nothing"
    assert ours._metrics["train"]["completions/clipped_ratio"] == [1 - len(ended) / len(trajectories)]
    assert ours._metrics["train"]["completions/mean_terminated_length"] == [
        pytest.approx(sum(t.num_agent_tokens for t in ended) / len(ended))]
    assert {"completions/mean_length", "frac_reward_zero_std", "rewards/turns/std", "custom/turns"} <= set(
        trl._metrics["train"])
    for key in ("prompt", "completion", "advantages"):
        assert ours._logs[key] == pytest.approx(trl._logs[key], nan_ok=True) if key == "advantages" else \
            ours._logs[key] == trl._logs[key], key
    for name in ("turns", "agent_tokens"):
        assert ours._logs["rewards"][name] == pytest.approx(trl._logs["rewards"][name], nan_ok=True)
    assert ours._logs["extra"]["custom_column"] == trl._logs["extra"]["custom_column"]


def test_pad_matches_trls():
    from trl.trainer.utils import pad as trl_pad

    rows = [[1, 2, 3], [4], [5, 6]]
    for side in ("left", "right"):
        for multiple in (None, 4):
            expected = trl_pad([torch.tensor(r) for r in rows], padding_value=9, padding_side=side,
                               pad_to_multiple_of=multiple)
            assert torch.equal(pad(rows, 9, side, multiple), expected)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_vllm_importance_sampling_ratio_by_hand(mode):
    """TRL's correction, expected values by hand: d = old - sampling on trained tokens (NaN -> 0)."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    sampling = torch.tensor([[-1.5, float("nan"), -0.5], [-3.0, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    ratio = vllm_importance_sampling_ratio(old, sampling, mask, mode, clip_min=0.5, clip_max=3.0)
    token = [[math.exp(0.5), 1.0, 1.0], [math.exp(2.0), 1.0, math.exp(1.0)]]
    sequence = [[math.exp(0.5)], [math.exp(3.0)]]
    raw = token if mode.startswith("token") else sequence
    if mode.endswith("truncate"):
        expected = [[min(max(v, 0.5), 3.0) for v in row] for row in raw]
    else:
        expected = [[v if 0.5 <= v <= 3.0 else 0.0 for v in row] for row in raw]
    torch.testing.assert_close(ratio, torch.tensor(expected))
