import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from trl_agentic.algorithms.losses import clipped_value_loss


def batch(seed: int, rows: int = 4, length: int = 10):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, length, generator=g) < 0.7).long()
    mask[0, 3:6] = 0  # an observation gap
    mask[1] = 0  # no agent token
    mask[2, -4:] = 0  # padding
    values = torch.randn(rows, length, generator=g, dtype=torch.float64)
    old_values = values + 0.3 * torch.randn(rows, length, generator=g, dtype=torch.float64)
    returns = torch.randn(rows, length, generator=g, dtype=torch.float64)
    return values, old_values, returns, mask


def reference_value_loss(values, old_values, returns, mask, c):
    losses, clipped = [], []
    for b in range(values.shape[0]):
        for t in range(values.shape[1]):
            if mask[b, t]:
                v, vo, r = float(values[b, t]), float(old_values[b, t]), float(returns[b, t])
                vc = vo + min(max(v - vo, -c), c)
                losses.append(max((v - r) ** 2, (vc - r) ** 2))
                clipped.append(float(abs(v - vo) > c and (vc - r) ** 2 > (v - r) ** 2))
    return 0.5 * sum(losses) / len(losses), sum(clipped) / len(clipped), 0.5 * sum(losses)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cliprange_value", [0.05, 0.2, 10.0])
def test_clipped_value_loss_matches_loop(seed, cliprange_value):
    values, old_values, returns, mask = batch(seed)
    loss, clip_fraction = clipped_value_loss(values, old_values, returns, mask, cliprange_value)
    ref_loss, ref_frac, ref_sum = reference_value_loss(values, old_values, returns, mask, cliprange_value)
    assert_close(loss, torch.tensor(ref_loss, dtype=torch.float64))
    assert_close(clip_fraction, torch.tensor(ref_frac, dtype=torch.float64))
    summed, _ = clipped_value_loss(values, old_values, returns, mask, cliprange_value, num_tokens=50)
    assert_close(summed, torch.tensor(ref_sum / 50, dtype=torch.float64))


def test_wide_clip_range_is_plain_squared_error():
    values, old_values, returns, mask = batch(0)
    loss, clip_fraction = clipped_value_loss(values, old_values, returns, mask, 1e6)
    m = mask.bool()
    assert_close(loss, 0.5 * ((values - returns)[m] ** 2).mean())
    assert clip_fraction.item() == 0.0


def test_value_loss_gradient_is_exactly_zero_at_masked_positions():
    values, old_values, returns, mask = batch(1)
    # garbage at masked positions must not leak into the gradient either
    returns = torch.where(mask.bool(), returns, torch.nan)
    old_values = torch.where(mask.bool(), old_values, torch.inf)
    values = values.clone().requires_grad_(True)
    loss, _ = clipped_value_loss(values, old_values, returns, mask, 0.2)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(values.grad[mask == 0] == 0)
    unclipped = (values - old_values).abs() < 0.2
    assert torch.all(values.grad[(mask == 1) & unclipped] != 0)


@pytest.mark.parametrize("seed", range(3))
def test_ppo_metrics_from_summed_moments_match_the_loop(seed):
    """PPO's round metrics come from sums gathered with the round's values (one collective call): summed over two
    "processes" they equal the loop over the whole batch."""
    from trl_agentic.trainers.ppo import ppo_metrics, ppo_sums

    values, _, returns, mask = batch(seed)
    values = returns + 0.5 * values  # a partly right critic
    scores, kl = torch.randn(values.size(0)), torch.rand_like(values)

    def metrics_of(v, r):
        halves = [ppo_sums(scores[k::2], v[k::2], r[k::2], mask[k::2], kl[k::2]) for k in (0, 1)]
        return ppo_metrics({name: halves[0][name] + halves[1][name] for name in halves[0]})

    r = [float(x) for x in returns[mask.bool()]]
    res = [float(x) for x in (returns - values)[mask.bool()]]
    got = metrics_of(values, returns)
    assert got["ppo/explained_variance"] == pytest.approx(1 - statistics.pvariance(res) / statistics.pvariance(r),
                                                          rel=1e-6)
    assert got["ppo/value_mean"] == pytest.approx(float(values[mask.bool()].mean()), rel=1e-5)
    assert got["ppo/score_mean"] == pytest.approx(float(scores.mean()), rel=1e-5, abs=1e-7)
    trained = mask.any(-1)
    assert got["ppo/kl_per_sequence"] == pytest.approx(float(kl.sum(-1)[trained].mean()), rel=1e-5)
    assert metrics_of(returns, returns)["ppo/explained_variance"] == pytest.approx(1.0)
    assert math.isnan(metrics_of(values, torch.ones_like(returns))["ppo/explained_variance"])
