"""KL estimators against their formulas, and their statistical properties on a toy pair of distributions."""

import math

import pytest
import torch

from trl_agentic.algorithms.kl import kl_penalty


def test_estimators_match_formulas():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    d = logp - ref
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), d)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * d**2)
    r = ref - logp
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(r) - r - 1)
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(logp, ref, "k5")


def test_unbiasedness_and_variance_on_samples():
    """k1 and k3 are unbiased for KL(p||q) on samples of p; k3 has lower variance than k1; k2 and k3 are >= 0."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(50), 0)
    q = torch.softmax(torch.randn(50) * 0.3 + torch.log(p), 0)
    true_kl = (p * (p.log() - q.log())).sum().item()
    x = torch.multinomial(p, 200_000, replacement=True)
    logp, logq = p.log()[x], q.log()[x]
    k1, k2, k3 = (kl_penalty(logp, logq, e) for e in ("k1", "k2", "k3"))
    assert math.isclose(k1.mean().item(), true_kl, rel_tol=0.03)
    assert math.isclose(k3.mean().item(), true_kl, rel_tol=0.03)
    assert k3.var() < k1.var()
    assert (k2 >= 0).all() and (k3 >= 0).all() and (k1 < 0).any()


def test_adaptive_kl_controller_moves_towards_target():
    from trl_agentic.algorithms.kl import AdaptiveKLController

    ctl = AdaptiveKLController(0.1, target=6.0, horizon=100)
    assert math.isclose(ctl.update(12.0, 10), 0.1 * (1 + 0.2 * 10 / 100))  # error clipped at +0.2
    assert math.isclose(ctl.update(5.4, 10), 0.102 * (1 - 0.1 * 10 / 100))  # inside the clip range
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=1)


def test_k1_as_a_grpo_loss_term_warns(tmp_path):
    from helpers import agentic_args, ppo_args

    with pytest.warns(UserWarning, match="zero expected gradient"):
        agentic_args(tmp_path, kl_estimator="k1", beta=0.1, use_bias_correction_kl=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        agentic_args(tmp_path, kl_estimator="k1", beta=0.1, use_bias_correction_kl=True)  # gradient of KL(pi||ref)
        ppo_args(tmp_path, kl_estimator="k1")  # PPO puts k1 in the reward: no warning


def test_expected_gradients_of_the_estimators_as_loss_terms():
    """On samples of pi, grad E[k1] = 0, grad E[k2] = grad KL(pi||ref), grad E[k3] = grad KL(ref||pi) (the estimator
    differentiated through log pi only, as in a loss), checked exactly by summing over the support."""
    torch.manual_seed(0)
    theta = torch.randn(6, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6), 0)

    def expected_grad(estimator):
        logp = torch.log_softmax(theta, 0)
        p = logp.exp().detach()
        value = (p * kl_penalty(logp, ref, estimator)).sum()  # E_pi[k(x)], sampling distribution held fixed
        return torch.autograd.grad(value, theta)[0]

    def true_grad(forward):
        logp = torch.log_softmax(theta, 0)
        kl = (logp.exp() * (logp - ref)).sum() if forward else (ref.exp() * (ref - logp)).sum()
        return torch.autograd.grad(kl, theta)[0]

    torch.testing.assert_close(expected_grad("k1"), torch.zeros(6), atol=1e-6, rtol=0)
    torch.testing.assert_close(expected_grad("k2"), true_grad(forward=True))
    torch.testing.assert_close(expected_grad("k3"), true_grad(forward=False))
