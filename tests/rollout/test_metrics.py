import math

import torch

from trl_agentic.rollout.metrics import logprob_gap


def test_logprob_gap_counts_masked_positions_only():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, -0.25]])
    sampling = torch.tensor([[-1.5, -2.0, -1.0], [-0.25, 0.0, -0.25]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])  # the 2.0 and 9.0 gaps are observations or padding
    deltas = [abs(t - s) for tr, sr, mr in zip(trainer.tolist(), sampling.tolist(), mask.tolist())
              for t, s, m in zip(tr, sr, mr) if m]
    mean, largest = logprob_gap(trainer, sampling, mask)
    assert math.isclose(mean, sum(deltas) / len(deltas)) and largest == max(deltas) == 0.5
    assert logprob_gap(trainer, sampling, torch.zeros_like(mask)) == (0.0, 0.0)
