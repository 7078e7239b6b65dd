import pytest
import torch
from torch.testing import assert_close

from trl_agentic.algorithms.gae import build_token_rewards, build_turn_rewards, token_gae, turn_gae
from trl_agentic.algorithms.turns import (
    broadcast_turns,
    gather_turn_values,
    turn_ids_from_spans,
    turn_mask,
    turn_sum,
)


def multi_turn_layout(seed: int, rows: int = 6) -> tuple[torch.Tensor, list[list[tuple[int, int]]]]:
    """Rows of agent segments separated by observation gaps, right-padded; row 1 has no agent token, row 2 has a
    turn of zero length, row 3 is cut by the length (truncation)."""
    g = torch.Generator().manual_seed(seed)
    layouts = []
    for _ in range(rows):
        spans, t = [], int(torch.randint(0, 2, (1,), generator=g))  # sometimes an observation first
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            length = int(torch.randint(1, 5, (1,), generator=g))
            spans.append((t, t + length))
            t += length + int(torch.randint(1, 4, (1,), generator=g))
        layouts.append(spans)
    layouts[1] = []
    layouts[2] = [(0, 3), (5, 5), (7, 9)]
    layouts[3] = layouts[3] + [(30, 40)]
    length = max(max((end for _, end in spans), default=0) for spans in layouts[:3] + layouts[4:]) + 2
    mask = torch.zeros(rows, length, dtype=torch.long)
    for row, spans in enumerate(layouts):
        for start, end in spans:
            mask[row, start:end] = 1
    return mask, layouts


def reference_gae(rewards, values, mask, gamma, lam):
    """Per row: list the agent positions, run textbook GAE over them, write back."""
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    ret = torch.zeros_like(rewards, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        steps = [t for t in range(rewards.shape[1]) if mask[b, t]]
        last_adv = 0.0
        for i in reversed(range(len(steps))):
            t = steps[i]
            next_value = float(values[b, steps[i + 1]]) if i + 1 < len(steps) else 0.0
            delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
            last_adv = delta + gamma * lam * last_adv
            adv[b, t] = last_adv
            ret[b, t] = last_adv + float(values[b, t])
    return adv.float(), ret.float()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_token_gae_matches_loop_over_agent_tokens(seed, gamma, lam):
    mask, _ = multi_turn_layout(seed)
    g = torch.Generator().manual_seed(100 + seed)
    rewards = torch.randn(mask.shape, generator=g)
    values = torch.randn(mask.shape, generator=g)
    adv, ret = token_gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = reference_gae(rewards, values, mask, gamma, lam)
    assert adv.dtype == ret.dtype == torch.float32
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    assert torch.all(adv[1] == 0)  # row with no agent token


def test_token_gae_bootstraps_across_an_observation_by_hand():
    # agent, agent, obs, obs, agent, pad
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    rewards = torch.tensor([[0.0, 0.0, 5.0, 5.0, 1.0, 9.0]])  # rewards on masked tokens are ignored
    values = torch.tensor([[0.5, 0.25, 7.0, 7.0, 0.75, 3.0]])
    gamma, lam = 0.9, 0.5
    a4 = 1.0 + gamma * 0.0 - 0.75
    a1 = 0.0 + gamma * 0.75 - 0.25 + gamma * lam * a4  # bootstraps from the agent token after the observation
    a0 = 0.0 + gamma * 0.25 - 0.5 + gamma * lam * a1
    adv, ret = token_gae(rewards, values, mask, gamma, lam)
    assert_close(adv, torch.tensor([[a0, a1, 0.0, 0.0, a4, 0.0]]))
    assert_close(ret, torch.tensor([[a0 + 0.5, a1 + 0.25, 0.0, 0.0, a4 + 0.75, 0.0]]))


def test_token_gae_without_observations_is_textbook_gae():
    g = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    gamma, lam = 0.97, 0.9
    adv, _ = token_gae(rewards, values, torch.ones(4, 7), gamma, lam)
    next_values = torch.cat([values[:, 1:], torch.zeros(4, 1)], dim=1)
    deltas = rewards + gamma * next_values - values
    closed_form = torch.stack(
        [sum((gamma * lam) ** (k - t) * deltas[:, k] for k in range(t, 7)) for t in range(7)], dim=1
    )
    assert_close(adv, closed_form)


def test_an_outcome_score_reaches_every_agent_token_whole_only_at_lambda_one():
    """With an outcome score alone (no KL), gamma = 1: at lam = 1 each agent token's advantage is ``score - V_t``
    (Search-R1's and verl's lam); at lam < 1 and V = 0 the score reaches token ``t`` scaled by ``lam ** n_t``, with
    ``n_t`` the agent tokens after it in the row (observations do not count): 0.95 ** 51 = 0.07 at the first token
    of a 52-token two-hop trajectory."""
    mask, _ = multi_turn_layout(2)
    g = torch.Generator().manual_seed(9)
    scores = torch.rand(mask.shape[0], generator=g)
    values = torch.where(mask.bool(), torch.randn(mask.shape, generator=g), 0.0)
    rewards = build_token_rewards(scores, mask)
    adv, _ = token_gae(rewards, values, mask, 1.0, 1.0)
    assert_close(adv, torch.where(mask.bool(), scores[:, None] - values, 0.0))
    adv, _ = token_gae(rewards, torch.zeros(mask.shape), mask, 1.0, 0.95)
    after = mask.flip(1).cumsum(1).flip(1) - 1  # agent tokens after each position
    assert_close(adv, torch.where(mask.bool(), scores[:, None] * 0.95 ** after.float(), 0.0))


def test_gae_ignores_non_finite_masked_inputs_and_detaches():
    mask, _ = multi_turn_layout(0)
    rewards = torch.where(mask.bool(), torch.randn(mask.shape), torch.nan)
    values = torch.where(mask.bool(), torch.randn(mask.shape), torch.inf).requires_grad_(True)
    adv, ret = token_gae(rewards, values, mask, 1.0, 0.95)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert not adv.requires_grad and not ret.requires_grad


def test_build_token_rewards_places_score_on_last_agent_token_and_kl_on_agent_tokens():
    mask, _ = multi_turn_layout(1)
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(mask.shape[0], generator=g)
    kl = torch.where(mask.bool(), torch.rand(mask.shape, generator=g), torch.nan)
    beta = 0.1
    rewards = build_token_rewards(scores, mask, kl, beta)
    expected = torch.zeros(mask.shape)
    for b in range(mask.shape[0]):
        agent = [t for t in range(mask.shape[1]) if mask[b, t]]
        for t in agent:
            expected[b, t] = -beta * kl[b, t]
        if agent:
            expected[b, agent[-1]] += scores[b]
    assert_close(rewards, expected)
    assert torch.all(rewards[1] == 0)  # no agent token: nothing placed
    assert_close(build_token_rewards(scores, mask), torch.where(expected != 0, expected + beta * kl, 0.0))


def test_turn_ids_from_spans_matches_loop():
    mask, spans = multi_turn_layout(2)
    mask[0, 0] = 0  # an agent position masked out by the completion mask must get -1 too
    ids = turn_ids_from_spans(spans, mask)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            expected = next((k for k, (s, e) in enumerate(spans[b]) if s <= t < e), -1) if mask[b, t] else -1
            assert ids[b, t] == expected, (b, t)
    with pytest.raises(ValueError):
        turn_ids_from_spans(spans[:-1], mask)


def turn_reference(spans, length):
    """Per row, the agent positions of each turn (clipped to the length)."""
    return [[[t for t in range(s, min(e, length))] for s, e in row] for row in spans]


@pytest.mark.parametrize("seed", range(3))
def test_turn_gather_sum_mask_and_broadcast_match_loops(seed):
    mask, spans = multi_turn_layout(seed)
    ids = turn_ids_from_spans(spans, mask)
    num_turns = max(len(s) for s in spans)
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(mask.shape, generator=g)
    x = torch.randn(mask.shape, generator=g)
    turn_x = torch.randn(mask.shape[0], num_turns, generator=g)
    positions = turn_reference(spans, mask.shape[1])
    exp_values = torch.zeros(mask.shape[0], num_turns)
    exp_sum = torch.zeros(mask.shape[0], num_turns)
    exp_mask = torch.zeros(mask.shape[0], num_turns, dtype=torch.bool)
    exp_broadcast = torch.zeros(mask.shape)
    for b, turns in enumerate(positions):
        for k, pos in enumerate(turns):
            if pos:
                exp_values[b, k] = values[b, pos[0]]  # first agent token of the turn
                exp_sum[b, k] = sum(float(x[b, t]) for t in pos)
                exp_mask[b, k] = True
                for t in pos:
                    exp_broadcast[b, t] = turn_x[b, k]
    assert_close(gather_turn_values(values, ids, num_turns), exp_values)
    assert_close(turn_sum(x, ids, num_turns), exp_sum)
    assert torch.equal(turn_mask(ids, num_turns), exp_mask)
    assert_close(broadcast_turns(turn_x, ids), exp_broadcast)


def test_zero_turns_and_zero_length_are_handled():
    ids = torch.full((2, 4), -1)
    assert gather_turn_values(torch.randn(2, 4), ids, 0).shape == (2, 0)
    assert torch.equal(broadcast_turns(torch.zeros(2, 0), ids), torch.zeros(2, 4))
    empty = torch.zeros(2, 0, dtype=torch.long)
    assert torch.equal(build_token_rewards(torch.ones(2), empty), torch.zeros(2, 0))
    adv, ret = token_gae(torch.zeros(2, 0), torch.zeros(2, 0), empty, 1.0, 0.95)
    assert adv.shape == ret.shape == (2, 0)


@pytest.mark.parametrize("seed", range(3))
def test_build_turn_rewards_matches_loop(seed):
    mask, spans = multi_turn_layout(seed)
    ids = turn_ids_from_spans(spans, mask)
    num_turns = max(len(s) for s in spans)
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(mask.shape[0], generator=g)
    env = torch.randn(mask.shape[0], num_turns, generator=g)
    kl = torch.where(mask.bool(), torch.rand(mask.shape, generator=g), torch.nan)
    rewards = build_turn_rewards(scores, ids, num_turns, env_rewards=env, kl=kl, beta=0.2)
    expected = torch.zeros(mask.shape[0], num_turns)
    for b, turns in enumerate(turn_reference(spans, mask.shape[1])):
        present = [k for k, pos in enumerate(turns) if pos]
        for k in present:
            expected[b, k] = env[b, k] - 0.2 * sum(float(kl[b, t]) for t in turns[k])
        if present:
            expected[b, present[-1]] += scores[b]
    assert_close(rewards, expected)
    only_score = build_turn_rewards(scores, ids, num_turns)
    assert_close(only_score.sum(1), torch.where(turn_mask(ids, num_turns).any(1), scores, 0.0))


@pytest.mark.parametrize("seed", range(3))
def test_turn_gae_matches_loop_over_present_turns(seed):
    mask, spans = multi_turn_layout(seed)
    ids = turn_ids_from_spans(spans, mask)
    num_turns = max(len(s) for s in spans)
    present = turn_mask(ids, num_turns)
    g = torch.Generator().manual_seed(seed)
    turn_rewards = torch.randn(present.shape, generator=g)
    turn_values = torch.randn(present.shape, generator=g)
    adv, ret = turn_gae(turn_rewards, turn_values, present, 0.95, 0.9)
    ref_adv, ref_ret = reference_gae(turn_rewards, turn_values, present, 0.95, 0.9)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


def test_turn_pipeline_equals_token_gae_when_each_turn_is_one_token():
    # Each turn is a single agent token: turn mode and token mode are the same MDP.
    mask = torch.tensor([[1, 0, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 0, 0]])
    spans = [[(0, 1), (3, 4), (5, 6)], [(1, 2), (3, 4)]]
    ids = turn_ids_from_spans(spans, mask)
    g = torch.Generator().manual_seed(0)
    values, kl = torch.randn(mask.shape, generator=g), torch.rand(mask.shape, generator=g)
    scores = torch.tensor([1.0, -0.5])
    token_adv, token_ret = token_gae(build_token_rewards(scores, mask, kl, 0.1), values, mask, 0.9, 0.8)
    turn_adv, turn_ret = turn_gae(
        build_turn_rewards(scores, ids, 3, kl=kl, beta=0.1),
        gather_turn_values(values, ids, 3),
        turn_mask(ids, 3),
        0.9,
        0.8,
    )
    assert_close(broadcast_turns(turn_adv, ids), token_adv)
    assert_close(broadcast_turns(turn_ret, ids), token_ret)
