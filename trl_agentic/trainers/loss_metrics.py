"""The loss-side metrics of an optimizer step, gathered in one collective call.

Our losses (:meth:`~trl_agentic.trainers.base.AgenticTrainer.clipped_loss`, PPO's value loss) compute, per
micro-batch, terms logged over every process: means over the trained tokens (entropy, clip ratio, KL), means over
micro-batches (the value loss), the off-policy weights' extremes. Each micro-batch adds its sums to a
:class:`LossMetrics` on its own process; when the optimizer step's last micro-batch has run, :meth:`LossMetrics.flush`
gathers every process's sums in one call (the same names, in the same order, on every process: every process runs
the same losses) and returns the metrics, which the trainer logs once per step. A mean over trained tokens is then
over every trained token of the step, on every process: ``sum_{micro-batches, processes} m_t x_t / sum m_t``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class LossMetrics:
    """Sums of the loss-side metrics since the last :meth:`flush` (module docstring). Each name is one kind: a mean
    (sums and counts), a maximum or a minimum."""

    def __init__(self) -> None:
        self._means: dict[str, list[float]] = {}
        self._maxima: dict[str, float] = {}
        self._minima: dict[str, float] = {}

    def clear(self) -> None:
        self._means, self._maxima, self._minima = {}, {}, {}

    def mean(self, name: str, total: torch.Tensor | float, count: torch.Tensor | float) -> None:
        """Add ``total`` over ``count`` items to the mean ``name``."""
        sums = self._means.setdefault(name, [0.0, 0.0])
        sums[0] += float(total)
        sums[1] += float(count)

    def maximum(self, name: str, value: torch.Tensor | float) -> None:
        self._maxima[name] = max(self._maxima.get(name, float("-inf")), float(value))

    def minimum(self, name: str, value: torch.Tensor | float) -> None:
        self._minima[name] = min(self._minima.get(name, float("inf")), float(value))

    def flush(self, gather: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> dict[str, float]:
        """Every process's sums gathered in one call (``gather``: accelerate's, concatenating a 1-D tensor of every
        process), as metrics; the sums start again. Nothing to gather (no loss of ours ran): no call, ``{}``."""
        means, maxima, minima = sorted(self._means), sorted(self._maxima), sorted(self._minima)
        if not (means or maxima or minima):
            return {}
        local = torch.tensor([*(v for n in means for v in self._means[n]), *(self._maxima[n] for n in maxima),
                              *(self._minima[n] for n in minima)], dtype=torch.float64, device=device)
        everyone = gather(local).view(-1, local.numel()).cpu()
        self.clear()
        metrics = {}
        for k, name in enumerate(means):
            total, count = everyone[:, 2 * k].sum().item(), everyone[:, 2 * k + 1].sum().item()
            metrics[name] = total / count if count > 0 else float("nan")
        offset = 2 * len(means)
        for k, name in enumerate(maxima):
            metrics[name] = everyone[:, offset + k].max().item()
        offset += len(maxima)
        for k, name in enumerate(minima):
            metrics[name] = everyone[:, offset + k].min().item()
        return metrics
