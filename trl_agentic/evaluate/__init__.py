"""Evaluation with the engine the trainers use: accuracy, pass@k and how the agent behaves.

For each dataset row, ``samples_per_row`` trajectories are rolled out (greedy or sampled) through the rollout seam
the trainers use (:mod:`~trl_agentic.rollout.seam`: the engine with our environments or TRL's, or agents through the
endpoint), scored by a TRL reward function (which receives the completions, ``trajectory`` and every dataset column,
as in training, and whose bad values cost one completion, as in training), and a sample counts as a success when
its reward is at least ``success_threshold``.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
arXiv 2107.03374): with ``n`` samples of a row of which ``c`` succeed,
``pass@k = 1 - C(n - c, k) / C(n, k)`` (1 when ``n - c < k``), averaged over rows; ``accuracy`` is pass@1, the mean
success rate.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from tqdm.contrib.logging import logging_redirect_tqdm

from ..environments.base import EnvironmentFactory, read_info
from ..kinds.entry import entry_rollout
from ..rewards.guard import guard_reward
from ..rewards.inputs import reward_inputs
from ..rollout.config import RolloutConfig
from ..rollout.generation import Generator, HFGenerator, get_eos_token_ids
from ..rollout.metrics import RoundFailures, failure_line
from ..rollout.seam import RolloutSeam, Runs
from ..trajectory import Trajectory

logger = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` successes: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class EvaluationReport:
    """What :func:`evaluate` measured (``to_dict`` gives the JSON report).

    Attributes:
        num_rows: Rows evaluated.
        samples_per_row: Trajectories per row.
        accuracy: Mean success rate (pass@1).
        pass_at_k: ``{k: pass@k}`` for each requested ``k <= samples_per_row``.
        mean_reward: Mean reward (unscorable samples left out).
        mean_turns: Mean model turns per trajectory.
        mean_tool_calls: Mean tool calls per trajectory (``turn_infos[*]["tool"]``).
        truncation_rate: Share of trajectories that did not end on their own.
        env_failure_rate: Share of trajectories whose environment raised or timed out.
        successes: Successes of each row.
        rewards: The reward of each trajectory (row-major, as the trajectories; ``None``: unscorable).
        reward_means: Each reward function's mean over the trajectories it scored, by name (TRL's
            ``rewards/<name>/mean``).
    """

    num_rows: int
    samples_per_row: int
    accuracy: float
    pass_at_k: dict[int, float]
    mean_reward: float
    mean_turns: float
    mean_tool_calls: float
    truncation_rate: float
    env_failure_rate: float
    successes: list[int] = field(repr=False)
    rewards: list[float | None] = field(repr=False, default_factory=list)
    reward_means: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (without the per-trajectory rewards)."""
        data = asdict(self)
        del data["rewards"]
        data["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
        return data

    def summary(self) -> str:
        """One line, for logs and progress output: pass@k of every requested ``k`` once some ``k`` is above 1 (with
        ``k = 1`` alone, accuracy is pass@1)."""
        shown = any(k > 1 for k in self.pass_at_k)
        passes = "  ".join(f"pass@{k} {v:.3f}" for k, v in self.pass_at_k.items()) if shown else ""
        return (f"accuracy {self.accuracy:.3f}{'  ' + passes if passes else ''}  reward {self.mean_reward:.3f}  "
                f"turns {self.mean_turns:.2f}  tool calls {self.mean_tool_calls:.2f}  "
                f"truncated {self.truncation_rate:.2f}  ({self.num_rows} rows x {self.samples_per_row})")


def score_rollout(
    reward_funcs: Sequence[Callable[..., Sequence[float | None]]],
    reward_weights: Sequence[float],
    seam: RolloutSeam,
    rows: Sequence[dict[str, Any]],
    runs: Runs,
    processing_class: Any,
    prompt_column: str = "prompt",
) -> tuple[list[float | None], list[list[float | None]]]:
    """Call TRL reward functions on the ``runs`` a rollout seam returned for ``rows`` as the trainers do
    (:func:`~trl_agentic.rewards.inputs.reward_inputs`: ``prompts`` and ``completions`` as TRL builds them,
    ``completion_ids``, every dataset column but the prompt as a list, and what the rollout adds: ``trajectory``,
    ``environments`` for TRL's ``environment_factory``, ``agent_output`` for agents), each through the guard training
    uses (:func:`~trl_agentic.rewards.guard.guard_reward`): a value that is not a finite number is ``None``, and a
    function that raises costs the completions it raises on, not the evaluation.

    Returns each run's reward and each function's values (one list per function). A run's reward is TRL's
    ``sum_k w_k R_k`` over the functions that scored it (``None`` when none did); a run whose environment (or agent)
    failed is unscorable (``None``), as in training: it counts as a failure."""
    trajectories, environments = runs
    prompts, completions, extras = reward_inputs(seam, rows, trajectories, environments, processing_class)
    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != prompt_column} if rows else {}
    for key in extras[0] if extras else ():
        columns[key] = [extra[key] for extra in extras]
    completion_ids = [t.completion_ids for t in trajectories]
    per_func = [list(guard_reward(func)(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                        **columns)) for func in reward_funcs]
    rewards: list[float | None] = []
    for i, t in enumerate(trajectories):
        scored = [w * values[i] for w, values in zip(reward_weights, per_func) if values[i] is not None]
        rewards.append(None if t.env_failed or not scored else sum(scored))
    return rewards, per_func


def evaluate(
    model: Any,
    processing_class: Any,
    environment: EnvironmentFactory | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    reward_funcs: Any = None,
    *,
    environment_factory: Any = None,
    tools: Sequence[Callable[..., Any]] | None = None,
    agent: Any = None,
    reward_weights: Sequence[float] | None = None,
    samples_per_row: int = 1,
    k: Sequence[int] = (1,),
    success_threshold: float = 1.0,
    greedy: bool = False,
    batch_size: int = 32,
    prompt_column: str = "prompt",
    config: RolloutConfig | None = None,
    generator: Generator | None = None,
    generation_config: Any = None,
    show_progress: bool = True,
    **config_kwargs: Any,
) -> tuple[EvaluationReport, list[Trajectory]]:
    """Roll out ``samples_per_row`` trajectories per row and measure them (module docstring).

    What is rolled out is given as the trainers take it, by the same names (:mod:`~trl_agentic.kinds.entry`):
    ``environment=`` (a trl-agentic environment class or factory), ``environment_factory=`` (TRL's environment
    class, or a dict of them), ``tools=`` (TRL's tool functions) or ``agent=`` (an agent of any framework, through the
    OpenAI-compatible endpoint; the reward functions also receive ``agent_output``).

    Args:
        model: A causal LM (ignored when ``generator`` is given).
        processing_class: Its tokenizer.
        environment: Class or zero-argument factory of a trl-agentic environment.
        rows: Dataset rows (a list of dicts or a ``datasets.Dataset``).
        reward_funcs: A TRL reward function (e.g. ``QAReward()``) or a list of them, as the trainers take them; with
            TRL's environment classes, each class's ``get_reward`` is added (weight 1), as in training. A sample
            succeeds when its reward (``sum_k w_k R_k``) is at least ``success_threshold``.
        environment_factory, tools, agent: The other kinds of rollout (above).
        reward_weights: One weight per function of ``reward_funcs`` (default 1 each).
        samples_per_row: Trajectories per row (``n`` of pass@k).
        k: The ``k`` of pass@k to report (each at most ``samples_per_row``).
        greedy: Greedy decoding (``do_sample=False``) instead of sampling.
        batch_size: Trajectories per generation batch.
        config: A :class:`~trl_agentic.RolloutConfig`, or its fields as keyword arguments (those left out take what
            the kind implies, as in training: chat rollouts for native tool calls, TRL's tool-loop budgets for TRL's
            tools).
        generator: Override the generation backend (default: transformers ``generate``).
        generation_config: transformers ``GenerationConfig`` (default: the model's).
        show_progress: A progress bar over batches.

    Returns:
        The report and the trajectories (row-major: the samples of row 0, then of row 1, ...). Greedy, with
        transformers, each trajectory's ``logprobs`` hold the log-prob of every generated token (one step's scores
        in memory at a time); sampled, they are ``None`` (keeping them would hold every step's scores).

    Raises:
        TypeError, ValueError: one line naming the fix: nothing to roll out, two kinds or one under another's name,
            rows or reward functions the rollout could not use, native tool calls with a chat template that has no
            response template to parse them.
    """
    if rows is None:
        raise TypeError("evaluate() needs rows=: the dataset rows to roll out (a list of dicts or a datasets.Dataset)")
    rows = [dict(row) for row in rows]
    rollout = entry_rollout("evaluate", processing_class, rows,
                            {"environment": environment, "environment_factory": environment_factory, "tools": tools,
                             "agent": agent}, config, config_kwargs, reward_funcs, reward_weights)
    if not rollout.reward_funcs:
        raise TypeError("evaluate() needs reward_funcs=: a TRL reward function or a list of them (or an "
                        "environment_factory class with get_reward())")
    if any(not 1 <= kk <= samples_per_row for kk in k):
        raise ValueError(f"each k must be between 1 and samples_per_row={samples_per_row}, got {list(k)}")
    if generator is None:
        generation_config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
        generation_config.do_sample = not greedy
        generator = HFGenerator(model, processing_class, generation_config, return_logprobs=greedy,
                                keep_cache=rollout.config.prefix_caching,
                                max_cached_tokens=rollout.config.max_cached_tokens)
    eos = get_eos_token_ids(processing_class, getattr(generator, "generation_config", None))
    seam = rollout.seam(processing_class, generator, eos, prompt_column)
    expanded = [row for row in rows for _ in range(samples_per_row)]
    batches = range(0, len(expanded), batch_size)
    if show_progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="evaluating", unit="batch")
    trajectories: list[Trajectory] = []
    rewards: list[float | None] = []
    per_func: list[list[float | None]] = [[] for _ in rollout.reward_funcs]
    with logging_redirect_tqdm() if show_progress else contextlib.nullcontext():  # warnings above the bar, not on it
        for start in batches:
            chunk = expanded[start : start + batch_size]
            done = seam.run(chunk)
            trajectories += done[0]
            chunk_rewards, chunk_per_func = score_rollout(rollout.reward_funcs, rollout.reward_weights, seam, chunk,
                                                          done, processing_class, prompt_column)
            rewards += chunk_rewards
            for values, more in zip(per_func, chunk_per_func):
                values += more
    seam.close()
    line = failure_line("evaluation", len(trajectories), [RoundFailures.of(trajectories)], " and count as failures")
    if line is not None:
        logger.warning(line)
    report = _report(rows, samples_per_row, list(k), success_threshold, trajectories, rewards)
    report.reward_means = {getattr(func, "__name__", type(func).__name__): _mean(values) for func, values in zip(rollout.reward_funcs, per_func)}
    return report, trajectories


def _mean(values: Sequence[float | None]) -> float:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else float("nan")


def _calls(info: dict[str, Any]) -> int:
    """Tool calls of one turn: the names in its ``tool``."""
    return len(read_info(info).tool)


def _report(rows, n, ks, success_threshold, trajectories, rewards) -> EvaluationReport:
    successes = [sum(1 for r in rewards[i * n : (i + 1) * n] if r is not None and r >= success_threshold)
                 for i in range(len(rows))]
    count = max(len(trajectories), 1)
    return EvaluationReport(
        num_rows=len(rows),
        samples_per_row=n,
        accuracy=sum(successes) / max(len(rows) * n, 1),
        pass_at_k={kk: sum(pass_at_k(n, c, kk) for c in successes) / max(len(rows), 1) for kk in sorted(set(ks))},
        mean_reward=_mean(rewards),
        mean_turns=sum(t.num_turns for t in trajectories) / count,
        mean_tool_calls=sum(_calls(info) for t in trajectories for info in t.turn_infos) / count,
        truncation_rate=sum(t.truncated for t in trajectories) / count,
        env_failure_rate=sum(t.env_failed for t in trajectories) / count,
        successes=successes,
        rewards=list(rewards),
    )
