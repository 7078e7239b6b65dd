"""The off-policy terms of asynchronous rollouts (``off_policy_terms``): what the loss clips against and its weight,
for each ``async_correction``, on trained tokens only."""

import math

import torch

from trl_agentic.algorithms.importance import off_policy_terms

PROXIMAL = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
BEHAVIOUR = torch.tensor([[-1.5, float("nan"), -0.25, -9.0]])  # a token whose behaviour log-prob is unknown
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position is an observation


def test_decoupled_clips_against_the_proximal_policy_weighted_by_proximal_over_behaviour():
    old, weight = off_policy_terms(PROXIMAL, BEHAVIOUR, MASK, "decoupled", "token_truncate", None, 10.0)
    assert torch.equal(old, PROXIMAL)
    expected = [math.exp(0.5), 1.0, math.exp(-0.25), 1.0]  # unknown and untrained tokens: on-policy
    torch.testing.assert_close(weight, torch.tensor([expected]))


def test_sequence_weights_multiply_the_trained_tokens_ratios():
    _, weight = off_policy_terms(PROXIMAL, BEHAVIOUR, MASK, "decoupled", "sequence_truncate", None, 10.0)
    torch.testing.assert_close(weight, torch.tensor([[math.exp(0.25)]]))
    _, masked = off_policy_terms(PROXIMAL, BEHAVIOUR, MASK, "decoupled", "sequence_mask", 0.5, 1.2)
    assert masked.item() == 0.0  # exp(0.25) = 1.28 is outside [0.5, 1.2]


def test_behaviour_clips_against_the_behaviour_policy_without_weight():
    old, weight = off_policy_terms(PROXIMAL, BEHAVIOUR, MASK, "behaviour", "token_truncate", None, None)
    assert weight is None
    torch.testing.assert_close(old, torch.tensor([[-1.5, -2.0, -0.25, -3.0]]))


def test_none_ignores_the_lag():
    old, weight = off_policy_terms(PROXIMAL, BEHAVIOUR, MASK, "none", "token_truncate", None, None)
    assert torch.equal(old, PROXIMAL) and weight is None
