"""What the trainers log, each from one collective call: a round's metrics and completions table, gathered once
per round, and the loss-side metrics, gathered once per optimizer step.

A round: :func:`round_values` reads this process's values off a round (:class:`RoundValues`: the rollout's counts,
the lengths, the mask audit's count, vLLM's sampling gaps, the rows of TRL's completions table and what the reward
functions logged, :class:`RoundTable`, and the algorithm's own sums, PPO's moments); the trainer gathers every
process's in one collective call (:meth:`~trl_agentic.trainers.base.AgenticTrainer.gather_round_values`), the only
one of a round's logging; :func:`summarize` computes the round over every process from them (:class:`RoundSummary`:
its metrics, counts, failures, completions table and the algorithm's sums).

An optimizer step: our losses (:meth:`~trl_agentic.trainers.base.AgenticTrainer.clipped_loss`, PPO's value loss)
compute, per micro-batch, terms logged over every process: means over the trained tokens (entropy, clip ratio, KL),
means over micro-batches (the value loss), the off-policy weights' extremes. Each micro-batch adds its sums to a
:class:`LossMetrics` on its own process; when the optimizer step's last micro-batch has run, :meth:`LossMetrics.flush`
gathers every process's sums in one call (the same names, in the same order, on every process: every process runs
the same losses) and returns the metrics, which the trainer logs once per step. A mean over trained tokens is then
over every trained token of the step, on every process: ``sum_{micro-batches, processes} m_t x_t / sum m_t``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..rollout.audit import unsampled_trained
from ..rollout.metrics import RoundFailures, logprob_gap
from ..rollout.seam import RolloutSeam
from .round import Round, RoundSummary


@dataclass
class SamplingValues:
    """This process's sampling gaps with vLLM, over its trained tokens.

    Attributes:
        gap: (1, 3) ``[mean |delta| * tokens, tokens, max |delta|]`` of ``log pi_train - log pi_sample``.
        correction: With vLLM's importance-sampling correction, TRL's values of this process: the mean and max of
            ``|delta|`` (0-d each; 0 without tokens) and ``[min, mean, max]`` of the ratio; else ``None``.
    """

    gap: torch.Tensor
    correction: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


@dataclass
class RoundTable:
    """This process's rows of TRL's completions table for a round, and what its reward functions logged.

    Attributes:
        prompts, completions: Per training row, as the reward functions received them.
        advantages: Per training row (PPO's: the mean over its trained tokens).
        columns: The columns logged with ``log_extra`` (and our multi-turn columns), one value per row.
        reward_metrics: The values each reward function logged with ``log_metric``, by name.
    """

    prompts: list[Any]
    completions: list[Any]
    advantages: list[float]
    columns: dict[str, list[Any]]
    reward_metrics: dict[str, list[float]]


@dataclass
class RoundValues:
    """This process's values a round's metrics are computed from (on the CPU, each tensor of its batch's dtype).

    Attributes:
        sums: The rollout seam's counts over the runs (:meth:`~trl_agentic.rollout.seam.RolloutSeam.sums`).
        lengths: Trained tokens per training row.
        prompt_tokens: Prompt tokens per training row.
        clipped: Per training row, whether its trajectory did not end on its own (TRL's clipped completions).
        unsampled_trained: Trained positions the model did not sample (the mask audit).
        sampling: With vLLM's sampling log-probs, its gaps; else ``None``.
        failures: The runs whose environment or agent failed (:class:`~trl_agentic.rollout.metrics.RoundFailures`).
        refusal: The message of a request the rollout's endpoint refused among the runs (agents), or ``None``.
        table: The round's rows of the completions table (:class:`RoundTable`).
        algorithm: The algorithm's own sums, each summed over processes (PPO's moments), by name.
    """

    sums: Counter
    lengths: torch.Tensor
    prompt_tokens: torch.Tensor
    clipped: torch.Tensor
    unsampled_trained: int
    sampling: SamplingValues | None
    failures: RoundFailures
    refusal: str | None
    table: RoundTable
    algorithm: dict[str, torch.Tensor]


def round_values(round_: Round, seam: RolloutSeam, mask_observations: bool, table: RoundTable,
                 algorithm: dict[str, torch.Tensor]) -> RoundValues:
    """This process's :class:`RoundValues` of a round (its batch as the sibling's step left it), with its
    completions ``table`` and the ``algorithm``'s sums. The mask audit (:mod:`trl_agentic.rollout.audit`) checks the
    trained positions against the seam's end ids; with ``mask_observations=False`` observation positions are
    allowed."""
    batch = round_.batch
    bad = 0
    for row, t in zip(batch.loss_mask.bool().cpu().tolist(), round_.trajectories):
        if not mask_observations:
            row = [flag and (i >= len(t.env_mask) or t.env_mask[i] == 1) for i, flag in enumerate(row)]
        bad += unsampled_trained(t, row, seam.eos_token_ids)
    sampling = None
    if batch.old_logps is not None and batch.sampling_logps is not None:
        sampling = sampling_values(batch)
    return RoundValues(
        sums=seam.sums(round_.runs),
        lengths=batch.loss_mask.sum(dim=1).cpu(),
        prompt_tokens=torch.tensor([len(t.prompt_ids) for t in round_.trajectories]),
        clipped=torch.tensor([t.truncated for t in round_.trajectories]),
        unsampled_trained=bad,
        sampling=sampling,
        failures=RoundFailures.of(round_.runs),
        refusal=seam.refusal(round_.runs),
        table=table,
        algorithm={name: value.detach().cpu() for name, value in algorithm.items()},
    )


def sampling_values(batch: Any) -> SamplingValues:
    """This process's :class:`SamplingValues` of a batch with vLLM's sampling log-probs (``TRLBatch``)."""
    mask = batch.loss_mask
    mean, largest = logprob_gap(batch.old_logps, batch.sampling_logps, mask)
    count = float(mask.sum())
    gap = torch.tensor([[mean * count, count, largest]])
    ratio = batch.data.get("importance_sampling_ratio")
    if ratio is None:
        return SamplingValues(gap=gap, correction=None)
    mask = mask.bool()
    delta = torch.abs(batch.old_logps - batch.sampling_logps)
    delta = delta[mask & ~torch.isnan(delta)]
    zero = torch.tensor(0.0, device=delta.device)
    delta_mean, delta_max = (delta.mean(), delta.max()) if delta.numel() else (zero, zero)
    flat = ratio.flatten() if ratio.size(1) == 1 else ratio[mask]
    stats = torch.stack([flat.min(), flat.mean(), flat.max()]) if flat.numel() else torch.zeros(3, device=flat.device)
    return SamplingValues(gap=gap, correction=(delta_mean.cpu(), delta_max.cpu(), stats.cpu()))


def summarize(everyone: Sequence[RoundValues], seam: RolloutSeam, device: torch.device) -> RoundSummary:
    """A round over every process from every process's values, in rank order (a pure function). Its metrics:

    - the rollout seam's own (``agentic/*``; TRL's ``tools/*``; ``agentic/agent/*``) from the summed counts;
    - TRL's length metrics (``grpo_trainer.py`` ``_generate``, l. 2276-2310): a completion's length counts its
      sampled (trained) tokens; it is clipped when its trajectory did not end on its own
      (:attr:`~trl_agentic.Trajectory.truncated`: a turn, token or environment budget cut it). TRL's test, a last
      token that is neither an end id nor the pad id, would call clipped every trajectory that ends at a stop
      string such as ``</answer>``;
    - ``agentic/mask_audit``: trained positions the model did not sample; must be 0;
    - with vLLM, ``agentic/vllm_logprob_gap`` (mean |delta| per token, :func:`~trl_agentic.rollout.metrics.
      logprob_gap`) and ``_max``, and TRL's metrics (``grpo_trainer.py`` l. 2860-2897):
      ``sampling/sampling_logp_difference/{mean,max}`` (mean over processes of each process's mean, as TRL) and,
      with the correction, ``sampling/importance_sampling_ratio/{min,mean,max}``.

    The figures are computed from the same tensors, on the same device, as with one gather per value, so that they
    (TRL's among them) are equal bit for bit.
    """
    sums: Counter = Counter()
    for values in everyone:
        sums.update(values.sums)
    metrics = seam.metrics(sums)
    lengths = torch.cat([v.lengths for v in everyone]).to(device).float()
    prompt_tokens = torch.cat([v.prompt_tokens for v in everyone]).to(device)
    clipped = torch.cat([v.clipped for v in everyone]).to(device)
    terminated = lengths[~clipped] if (~clipped).any() else torch.zeros(1, device=device)
    metrics.update({
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": clipped.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
    })
    metrics["agentic/mask_audit"] = float(sum(v.unsampled_trained for v in everyone))
    sampling = [v.sampling for v in everyone if v.sampling is not None]
    if sampling:
        metrics.update(sampling_metrics(sampling, device))
    first = everyone[0].algorithm
    return RoundSummary(
        metrics=metrics,
        tokens=int((prompt_tokens.sum() + lengths.sum()).item()),
        sums=sums,
        failures=[v.failures for v in everyone],
        refusal=next((v.refusal for v in everyone if v.refusal), None),
        table=table_rows([v.table for v in everyone]),
        algorithm={name: sum((v.algorithm[name] for v in everyone[1:]), first[name]) for name in first},
    )


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


def add_sampling_values(metrics: LossMetrics, values: SamplingValues) -> None:
    """A micro-batch's sampling gaps (:class:`SamplingValues`) added to the loss-side ``metrics`` of its optimizer
    step, under the names :func:`sampling_metrics` gives a round's. Every name is added whatever the values (a NaN
    statistic as an empty mean, an infinite extreme), so that every process gathers the same names."""
    total, count, largest = values.gap[0].tolist()
    metrics.mean("agentic/vllm_logprob_gap", total, count)
    metrics.maximum("agentic/vllm_logprob_gap_max", largest)
    if values.correction is None:
        return
    delta_mean, delta_max, stats = values.correction
    metrics.mean("sampling/sampling_logp_difference/mean", delta_mean, 1)
    metrics.maximum("sampling/sampling_logp_difference/max", delta_max)
    low, mean, high = stats.tolist()
    finite = not any(math.isnan(x) for x in (low, mean, high))
    metrics.minimum("sampling/importance_sampling_ratio/min", low if finite else math.inf)
    metrics.mean("sampling/importance_sampling_ratio/mean", mean if finite else 0.0, 1 if finite else 0)
    metrics.maximum("sampling/importance_sampling_ratio/max", high if finite else -math.inf)


def table_rows(everyone: Sequence[RoundTable]) -> tuple[list[Any], list[Any], list[float], dict[str, list[Any]],
                                                           dict[str, float]]:
    """Every process's completions table, in rank order: prompts, completions, advantages, each ``log_extra``
    column (a process that did not log it: ``None`` for its rows; names sorted) and the mean of each ``log_metric``
    metric over every value logged (names sorted), as TRL's ``_generate_and_score_completions`` builds them
    (``grpo_trainer.py`` l. 2832-2855) from its own gathers."""
    prompts = [p for t in everyone for p in t.prompts]
    completions = [c for t in everyone for c in t.completions]
    advantages = [a for t in everyone for a in t.advantages]
    names = sorted({name for t in everyone for name in t.columns})
    columns = {name: [v for t in everyone for v in t.columns.get(name, [None] * len(t.prompts))] for name in names}
    metrics = {}
    for name in sorted({name for t in everyone for name in t.reward_metrics}):
        stats = torch.stack([torch.tensor([sum(values := t.reward_metrics.get(name, [])), len(values)],
                                          dtype=torch.float32) for t in everyone])
        total, count = stats.sum(dim=0).tolist()  # TRL's float32 sums per process, then over processes
        metrics[name] = total / count
    return prompts, completions, advantages, columns, metrics


def sampling_metrics(everyone: Sequence[SamplingValues], device: torch.device) -> dict[str, float]:
    """vLLM's sampling metrics from every process's :class:`SamplingValues` (see :func:`metrics_of_round`)."""
    total = torch.cat([v.gap for v in everyone]).to(device)
    metrics = {"agentic/vllm_logprob_gap": (total[:, 0].sum() / total[:, 1].sum().clamp(min=1.0)).item(),
               "agentic/vllm_logprob_gap_max": total[:, 2].max().item()}
    corrections = [v.correction for v in everyone if v.correction is not None]
    if not corrections:
        return metrics
    means, largest, stats = (torch.stack(column).to(device) for column in zip(*corrections))
    metrics["sampling/sampling_logp_difference/mean"] = means.mean().item()
    metrics["sampling/sampling_logp_difference/max"] = largest.max().item()
    gathered = stats
    kept = gathered[~torch.isnan(gathered).any(dim=1)]
    kept = kept if kept.numel() else torch.full((1, 3), torch.nan, device=device)
    metrics["sampling/importance_sampling_ratio/min"] = kept[:, 0].min().item()
    metrics["sampling/importance_sampling_ratio/mean"] = kept[:, 1].mean().item()
    metrics["sampling/importance_sampling_ratio/max"] = kept[:, 2].max().item()
    return metrics
