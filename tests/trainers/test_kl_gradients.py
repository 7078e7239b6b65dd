"""The KL gradient claims of the table in docs/guide.md and of AgenticGRPOConfig's help, checked exactly: on a categorical
distribution the expectation over samples is a finite sum, so the expected gradient of ``beta * KL_t`` as a loss
term (times the importance ratio ``pi / pi_old`` when ``use_bias_correction_kl``) is computed by autograd and
compared with the gradients of KL(pi||ref) and KL(ref||pi) written out directly."""

import warnings

import pytest
import torch
from helpers import agentic_args

from trl_agentic.algorithms.kl import kl_penalty


def _grad(objective, theta):
    theta = theta.clone().requires_grad_(True)
    objective(torch.log_softmax(theta, 0)).backward()
    return theta.grad


@pytest.mark.parametrize(
    "estimator,bias_correction,expected",
    [("k1", False, "zero"), ("k2", False, "forward"), ("k3", False, "reverse"),
     ("k1", True, "forward"), ("k2", True, "neither"), ("k3", True, "forward")],
)
def test_expected_gradient_of_each_estimator(estimator, bias_correction, expected):
    torch.manual_seed(0)
    theta, ref = torch.randn(7, dtype=torch.float64), torch.log_softmax(torch.randn(7, dtype=torch.float64), 0)

    def surrogate(logp):  # E_{y ~ pi_old}[w(y) k(y)] at pi_old = pi, w = pi / pi_old (value 1, gradient kept)
        old = logp.detach()
        weight = torch.exp(logp - old) if bias_correction else torch.ones_like(logp)
        return (old.exp() * weight * kl_penalty(logp, ref, estimator)).sum()

    grads = {
        "zero": torch.zeros(7, dtype=torch.float64),
        "forward": _grad(lambda logp: (logp.exp() * (logp - ref)).sum(), theta),  # KL(pi || ref)
        "reverse": _grad(lambda logp: (ref.exp() * (ref - logp)).sum(), theta),  # KL(ref || pi)
    }
    ours = _grad(surrogate, theta)
    for name, grad in grads.items():
        assert torch.allclose(ours, grad, atol=1e-10) is (name == expected), name


@pytest.mark.parametrize("bias_correction", [True, False])
def test_k1_warning_only_when_its_gradient_is_zero(tmp_path, bias_correction):
    """Defect: the warning fired with TRL's default use_bias_correction_kl=True, where k1's gradient is KL's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agentic_args(tmp_path, kl_estimator="k1", beta=0.1, use_bias_correction_kl=bias_correction)
    assert any("zero expected gradient" in str(w.message) for w in caught) is (not bias_correction)
