"""``AgenticGRPOTrainer``: TRL's GRPOTrainer with multi-turn environment rollouts.

Without ``environment=`` it is ``GRPOTrainer`` unchanged (same losses, number for number). With an environment one
generation round reads top to bottom in :meth:`AgenticGRPOTrainer.training_batch`: rows -> rollout
(:class:`~trl_agentic.rollout.engine.RolloutEngine`: token-exact multi-turn episodes) -> rewards (TRL's reward
functions) -> group advantages -> the batch TRL's loss reads, whose mask of trained tokens (``tool_mask``) is the
engine's ``env_mask``: observation tokens are out of the policy loss, the KL and the entropy. Every TRL internal it
relies on is in :mod:`trl_agentic.compat`.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOConfig

from ..algorithms.advantages import frac_reward_zero_std, group_advantages, nanstd, zero_std_groups
from ..algorithms.kl import KL_ESTIMATORS, kl_penalty
from ..algorithms.losses import clipped_policy_loss
from ..algorithms.masked import masked_sum, zero_masked
from ..compat import GRPOTrainerBoundary, check_trl_version, trl_tool_chat_template, unwrap_for_generation
from ..environment import EnvironmentFactory
from ..native_tools import ensure_response_parser
from ..rewards.guard import guard_reward
from ..rewards.inputs import reward_inputs
from ..rollout.audit import unsampled_trained
from ..rollout.engine import RolloutConfig, RolloutEngine
from ..rollout.generation import Generator, HFGenerator
from ..rollout.metrics import logprob_gap, metrics_from_sums, rollout_sums, trl_tool_metrics
from ..rollout.vllm import TRLVLLMGenerator
from ..trackers import trajectory_columns
from ..trajectory import Trajectory, save_trajectories
from ..trl_environments import EMPTY_PROMPT, from_trainer_kwargs, trl_rollout_environments, trl_trainer_kwargs
from .checks import (
    DegenerateStepMonitor,
    DegenerateTrainingError,
    check_response_parser,
    keyword_arguments,
    run_construction_checks,
    uses_native_tool_calls,
)
from .round import Round, TRLBatch, pad, trl_completion_rows, vllm_importance_sampling_ratio
from .zero_variance import merge_rounds, pick_groups

ZERO_VARIANCE_POLICIES = ("keep", "std_floor", "dynamic_sampling")
ROLLOUT_DEFAULTS: dict[str, Any] = {"rollout_mode": "text", "max_turns": 4, "max_tokens_per_turn": 256}
"""The values of the rollout fields left unset, unless native tool calls imply others
(:meth:`AgenticGRPOConfig.use_tool_loop_defaults`)."""
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the loss types of AgenticGRPOTrainer.clipped_loss


@dataclass
class AgenticGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus multi-turn rollout settings.

    Budgets: ``max_completion_length`` stays the budget of a whole trajectory (sampled and observation tokens),
    ``max_tokens_per_turn`` caps one turn, ``max_turns`` the number of model turns, ``max_observation_tokens`` one
    observation's content.

    KL (``beta``, ``kl_estimator``), on agent tokens only, with ``r = logp_ref - logp`` at tokens sampled from the
    policy (Schulman 2020, "Approximating KL divergence"). As a *loss* term (GRPO), what matters is the expected
    gradient (Tang & Munos 2025, arXiv 2506.09477), and it depends on TRL's ``use_bias_correction_kl``, which
    multiplies the term by the importance ratio ``pi / pi_old``:

    - ``use_bias_correction_kl=False``: ``k1 = -r`` has zero expected gradient (it is a reward penalty, PPO's),
      ``k2 = r^2 / 2`` gives the gradient of KL(pi || pi_ref), ``k3 = exp(r) - r - 1`` that of KL(pi_ref || pi).
    - ``use_bias_correction_kl=True`` (TRL's default): ``k1`` and ``k3`` both give the gradient of KL(pi || pi_ref)
      (the ratio turns their expectation into E_pi[k] = KL(pi || pi_ref)); ``k2`` that of E_pi[r^2 / 2].
    """

    max_turns: int | None = field(
        default=None,
        metadata={"help": "Most model turns per trajectory. Unset: 4, or with TRL's tools=/environment_factory= "
                  "TRL's max_tool_calling_iterations + 1 (no turn limit when that is unset either: the token budget "
                  "ends the rollout)."},
    )
    max_tokens_per_turn: int | None = field(
        default=None,
        metadata={"help": "Most tokens sampled in one turn. Unset: 256, or with TRL's tools=/environment_factory= "
                  "max_completion_length (TRL's tool loop)."},
    )
    rollout_mode: str | None = field(
        default=None,
        metadata={"help": "'text': observations continue the text (base models, Search-R1). 'chat': each "
                  "observation is a new message rendered by the chat template (instruct models). Unset: 'chat' for "
                  "native tool calls (TRL's tools=/environment_factory=, a ToolCallEnvironment), else 'text'."},
    )
    observation_role: str = field(
        default="tool",
        metadata={"help": "Message role of observations in chat mode ('user' for templates without a tool role, "
                  "e.g. Gemma)."},
    )
    stop_strings: list[str] | None = field(
        default=None, metadata={"help": "Extra stop strings (the environment's own are always used)."}
    )
    max_observation_tokens: int = field(
        default=1024, metadata={"help": "Most tokens of one observation's content (the head is kept)."}
    )
    env_timeout: float = field(default=60.0, metadata={"help": "Seconds per environment reset/step/close call."})
    overlap_chunks: str = field(
        default="auto",
        metadata={"help": "Generate each turn in this many chunks so that one chunk's tool calls run while the next "
                  "generates: 'auto' (two chunks when the first turn's tools took at least a quarter of its generation time), "
                  "1 (off), or a number."},
    )
    concurrent_sync_tools: bool = field(
        default=False,
        metadata={"help": "TRL's tools=/environment_factory=: run sync tools concurrently on worker threads. Default "
                  "(TRL's): one after another on the training thread, where a tool may use signal.alarm or a "
                  "thread-bound resource (a sqlite connection opened in __init__); only for thread-safe tools."},
    )
    answer_malformed_tool_calls: bool = field(
        default=False,
        metadata={"help": "TRL's tools=/environment_factory=: answer a tool call the response template cannot parse "
                  "with {'error': ...} and let the model try again. Default (TRL's): the rollout ends at that turn."},
    )
    check_tool_argument_types: bool = field(
        default=False,
        metadata={"help": "TRL's tools=/environment_factory=: answer an argument whose JSON type differs from the "
                  "tool's schema with {'error': ...} before the tool runs. Default (TRL's): the tool is called with "
                  "it."},
    )
    kl_estimator: str = field(
        default="k3",
        metadata={"help": "KL estimator on agent tokens: 'k3' (TRL's), 'k2' or 'k1'. Gradient as a loss term with "
                  "use_bias_correction_kl=True (TRL's default): k1 and k3 that of KL(pi||ref), k2 that of "
                  "E_pi[(log pi/ref)^2/2]; with False: k3 that of KL(ref||pi), k2 that of KL(pi||ref), k1 zero."},
    )
    mask_observations: bool = field(
        default=True,
        metadata={"help": "Mask observation tokens out of the loss (default). False trains on them too, as in "
                  "Search-R1's masking ablation."},
    )
    mask_truncated_trajectories: bool = field(
        default=False,
        metadata={"help": "Exclude trajectories that did not end on their own (budget, environment truncation or "
                  "failure) from the loss."},
    )
    trajectory_dir: str | None = field(
        default=None,
        metadata={"help": "Append every rollout, with its rewards and advantage, to <dir>/trajectories-rank<k>.jsonl."},
    )
    zero_variance_groups: str = field(
        default="keep",
        metadata={"help": "Groups whose rewards are all equal: 'keep' (log only), 'std_floor' (divide by "
                  "max(std, std_floor)) or 'dynamic_sampling' (DAPO: drop them and sample more prompts)."},
    )
    std_floor: float = field(default=0.1, metadata={"help": "Smallest group std used with 'std_floor'."})
    max_extra_generation_rounds: int = field(
        default=2, metadata={"help": "Dynamic sampling: most extra generation rounds per step."}
    )
    max_degenerate_steps: int = field(
        default=3,
        metadata={"help": "Stop training after this many generation rounds in a row in which no completion could be "
                  "scored (every trajectory ended env_error/env_timeout, or every reward was None): such a round "
                  "trains nothing. The error quotes the first failure and where the trajectories are. 0: never stop."},
    )

    def __post_init__(self) -> None:
        # Rollout fields left unset take the generic defaults now, and TRL's tool-loop values if the trainer turns out
        # to run TRL's tools=/environment_factory= (:meth:`use_tool_loop_defaults`).
        self._unset_rollout_fields = tuple(name for name in ROLLOUT_DEFAULTS if getattr(self, name) is None)
        for name in self._unset_rollout_fields:
            setattr(self, name, ROLLOUT_DEFAULTS[name])
        if self.activation_checkpointing is None:  # TRL's default sets the name transformers deprecates: pass the new
            self.activation_checkpointing = self.gradient_checkpointing  # one, so no FutureWarning nobody can act on
        super().__post_init__()
        self._check_agentic_fields()
        if (self.kl_estimator == "k1" and self.beta != 0.0 and not self.use_bias_correction_kl
                and type(self) is AgenticGRPOConfig):
            warnings.warn(
                "kl_estimator='k1' with use_bias_correction_kl=False has zero expected gradient as a GRPO loss term, "
                "so it does not pull the policy towards the reference; keep use_bias_correction_kl=True (then its "
                "gradient is that of KL(pi||ref)), use 'k3' or 'k2', or put k1 in the reward with AgenticPPOTrainer.",
                stacklevel=3,
            )
        if self.use_vllm and self.vllm_enable_sleep_mode and self.max_turns > 1:
            warnings.warn(
                "vllm_enable_sleep_mode=True: TRL puts vLLM to sleep (level 2) after every generate call, so each turn "
                "of a multi-turn rollout pushes the weights again and loses the prefix cache of the earlier turns; "
                "keep the default False unless GPU memory forces it.",
                stacklevel=3,
            )
        if not self.mask_observations:
            warnings.warn(
                "mask_observations=False: observation tokens (tool output) are trained on, as in Search-R1's "
                "ablation, which lowered its results; keep the default unless you are reproducing it.",
                stacklevel=3,
            )

    def _check_agentic_fields(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.rollout_mode not in ("text", "chat"):
            raise ValueError(f"rollout_mode must be 'text' or 'chat', got {self.rollout_mode!r}")
        if self.zero_variance_groups not in ZERO_VARIANCE_POLICIES:
            raise ValueError(f"zero_variance_groups must be one of {ZERO_VARIANCE_POLICIES}, got "
                             f"{self.zero_variance_groups!r}")
        if self.zero_variance_groups == "std_floor" and self.scale_rewards != "group":
            raise ValueError("zero_variance_groups='std_floor' needs scale_rewards='group'")
        if isinstance(self.max_degenerate_steps, bool) or not isinstance(self.max_degenerate_steps, int) \
                or self.max_degenerate_steps < 0:
            raise ValueError(f"max_degenerate_steps must be an integer >= 0 (0: never stop), got "
                             f"{self.max_degenerate_steps!r}")
        self.max_tokens_per_turn = min(self.max_tokens_per_turn, self.max_completion_length)
        self.rollout_config()  # validates the budgets and stop strings

    def use_tool_loop_defaults(self, trl_tools: bool) -> None:
        """Native tool calls imply chat rollouts: the rollout fields left unset take the values that make a TRL script
        behave as in TRL. ``rollout_mode`` becomes ``"chat"``; with TRL's ``tools=``/``environment_factory=``
        (``trl_tools``) also TRL's tool-loop budgets: one turn may use all of ``max_completion_length``, and at most
        ``max_tool_calling_iterations + 1`` model turns (no turn limit when that is unset: the token budget ends the
        rollout). Fields the user set are kept (an explicit ``rollout_mode='text'`` is refused later)."""
        unset = getattr(self, "_unset_rollout_fields", ())
        values: dict[str, Any] = {"rollout_mode": "chat"}
        if trl_tools:
            iterations = getattr(self, "max_tool_calling_iterations", None)
            values["max_tokens_per_turn"] = self.max_completion_length
            values["max_turns"] = iterations + 1 if iterations is not None else self.max_completion_length
        for name, value in values.items():
            if name in unset:
                setattr(self, name, value)

    def rollout_config(self) -> RolloutConfig:
        return RolloutConfig(
            max_turns=self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            max_completion_length=self.max_completion_length,
            rollout_mode=self.rollout_mode,
            observation_role=self.observation_role,
            stop_strings=tuple(self.stop_strings or ()),
            max_observation_tokens=self.max_observation_tokens,
            env_timeout=self.env_timeout,
            chat_template_kwargs=dict(self.chat_template_kwargs or {}),
            overlap_chunks="auto" if str(self.overlap_chunks) == "auto" else _as_int(self.overlap_chunks, "overlap_chunks"),
        )


def row_advantages(batch: TRLBatch) -> torch.Tensor:
    """One advantage per row: GRPO's, or for per-token advantages (PPO) their mean over the row's trained tokens."""
    advantages = batch.advantages.detach().float()
    if advantages.dim() == 1:
        return advantages
    mask = batch.loss_mask
    return masked_sum(advantages, mask, dim=1) / mask.sum(1).clamp(min=1)


def _as_int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be 'auto' or an integer, got {value!r}") from None


class AgenticGRPOTrainer(GRPOTrainerBoundary):
    """GRPO over multi-turn environment rollouts; a drop-in replacement for ``GRPOTrainer``.

    Example::

        from functools import partial
        from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, TagEnvironment
        from trl_agentic.rewards import QAReward

        trainer = AgenticGRPOTrainer(
            model="Qwen/Qwen2.5-0.5B-Instruct",
            reward_funcs=QAReward(),
            args=AgenticGRPOConfig(output_dir="out", max_turns=4, max_completion_length=1024),
            train_dataset=dataset,  # rows with "prompt" (+ any columns: they reach reset() and the rewards)
            environment=partial(TagEnvironment, tools={"search": (search, "information")}),
        )
        trainer.train()

    Args:
        environment: A class or zero-argument factory returning a fresh :class:`~trl_agentic.Environment` per
            trajectory. ``None`` keeps plain ``GRPOTrainer`` behaviour.
        task: Optional :class:`~trl_agentic.tasks.Task`: the model card then states its tool protocol, its prompt and
            how to run the trained agent (:mod:`trl_agentic.model_card`).
        *args, **kwargs: As ``GRPOTrainer``. ``args`` should be an :class:`AgenticGRPOConfig`.

    Reward functions receive, besides TRL's keyword arguments, ``trajectory``: the
    :class:`~trl_agentic.Trajectory` of each completion (actions, observations, turn rewards, tool infos). A reward
    that is not a finite number counts as unscorable (``None``); a trajectory whose environment failed is unscorable
    for every reward function (advantage 0, outside its group's baseline).
    """

    config_class: type = AgenticGRPOConfig  # the default config when args=None with tools=/environment_factory=

    def __init__(self, *args: Any, environment: EnvironmentFactory | None = None, task: Any = None,
                 **kwargs: Any) -> None:
        check_trl_version()
        kwargs, args = keyword_arguments(args, kwargs), ()  # GRPOTrainer's arguments, all by name
        # TRL's tools= / environment_factory= run through our engine, as native tool calls (issue 18)
        native = from_trainer_kwargs(kwargs, environment)
        if native is not None:  # args, get_reward columns, reward_weights, train_dataset: as TRL derives them
            environment = native
            kwargs = trl_trainer_kwargs(native, kwargs, self.config_class)
        elif uses_native_tool_calls(environment) and isinstance(kwargs.get("args"), AgenticGRPOConfig):
            kwargs["args"] = copy.copy(kwargs["args"])  # a ToolCallEnvironment implies chat rollouts
            kwargs["args"].use_tool_loop_defaults(trl_tools=False)
        self.environment = environment
        self.task = task
        config = kwargs.get("args")
        if environment is None and getattr(config, "zero_variance_groups", "keep") != "keep":
            raise ValueError("zero_variance_groups applies to environment rollouts; without environment= the trainer "
                             "is TRL's GRPOTrainer: pass environment= or leave zero_variance_groups='keep'")
        if environment is not None:
            fields = ("trajectory", "environments") if native is not None else ("trajectory",)
            run_construction_checks(environment, args, kwargs, fields)  # trainers/checks.py: fail before training
            if kwargs.get("rollout_func") is not None:
                raise ValueError("pass either environment= or rollout_func=, not both")
            funcs = kwargs.get("reward_funcs")

            kwargs["reward_funcs"] = ([guard_reward(f) for f in funcs] if isinstance(funcs, (list, tuple))
                                      else guard_reward(funcs))
        super().__init__(**kwargs)
        self._vllm_weights_step = -1  # the global step whose weights vLLM holds (rollout)
        if environment is not None:
            self._check_agentic_args()
            self._degenerate = DegenerateStepMonitor(self.args.max_degenerate_steps, self.args.trajectory_dir)
            check_response_parser(environment, self.processing_class)  # native tool calls: a response template
        if environment is not None:
            self.rollout_settings = self.args.rollout_config()
        if native is not None:
            ensure_response_parser(self.processing_class)
            self.tools = native.all_tools()  # TRL's attribute: the standalone tools and every environment's methods
            template = trl_tool_chat_template(self.processing_class)  # TRL swaps Qwen3's for its training variant
            if template is not None:
                self.rollout_settings.chat_template_kwargs["chat_template"] = template
        if self.beta != 0.0 and getattr(self.args, "kl_estimator", "k3") != "k3":
            self._check_clipped_loss_settings()

    def _check_agentic_args(self) -> None:
        if not isinstance(self.args, AgenticGRPOConfig):
            raise TypeError("environment= needs args=AgenticGRPOConfig(...) (or AgenticPPOConfig), got "
                            f"{type(self.args).__name__}")
        if self.args.mask_truncated_completions:
            raise ValueError(
                "mask_truncated_completions checks for a final EOS, which multi-turn trajectories ending at a stop "
                "string lack; use mask_truncated_trajectories=True instead"
            )

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, **kwargs: Any) -> None:
        """TRL's card, or, with ``task=``, one that says how to run the agent (written by TRL at each save and by
        ``push_to_hub``), on the main process, to ``<output_dir>/README.md``."""
        if self.task is None:
            return super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags, **kwargs)
        if not self.is_world_process_zero():
            return None
        from ..model_card import model_card

        tags = [tags] if isinstance(tags, str) else list(tags or [])
        os.makedirs(self.args.output_dir, exist_ok=True)
        model_card(self, self.task, model_name, dataset_name, tags).save(os.path.join(self.args.output_dir, "README.md"))
        return None

    # -- one generation round: rows -> rollout -> rewards -> advantages -> batch ------------------------------
    def training_batch(self, rows: list[dict[str, Any]]) -> TRLBatch:
        """The batch of one generation round of dataset ``rows``. Without an environment it is TRL's, untouched.
        With one, read top to bottom:

        1. :meth:`generation_round`: the rollout (our engine), TRL's reward functions, the batch in TRL's layout;
        2. :meth:`_set_group_advantages`: GRPO's group-relative advantages (``std_floor`` when configured), then
           TRL's reward metrics and completions table;
        3. ``dynamic_sampling``: more rounds until enough groups have a reward spread (:meth:`_dynamic_sampling`);
        4. the round's trajectories to ``trajectory_dir`` (:meth:`_record`).
        """
        if self.environment is None:
            return super().training_batch(rows)
        round_ = self.generation_round(rows)
        self._set_group_advantages(round_)
        if self.args.zero_variance_groups == "dynamic_sampling" and self.model.training:
            return self._dynamic_sampling(rows, round_)
        self._record(round_)
        return round_.batch

    def generation_round(self, rows: list[dict[str, Any]]) -> Round:
        """Roll out and score one round of dataset ``rows``; the batch's advantages are left at 0 for the step to set.

        - rollout: one :class:`~trl_agentic.Trajectory` per row (:meth:`rollout`);
        - rewards: TRL's reward functions with TRL's keyword arguments and ``trajectory``
          (:meth:`~trl_agentic.compat.GRPOTrainerBoundary.trl_rewards`); a trajectory whose environment failed
          carries no learning signal and is unscorable (NaN) for every function;
        - batch: TRL's layout (:meth:`_batch`), with TRL's per-round metrics.
        """
        trajectories, instances = self.rollout(rows)
        completion_ids, env_mask, logprobs = trl_completion_rows(
            trajectories, self.processing_class.pad_token_id, self.args.mask_observations,
            self.args.mask_truncated_trajectories)
        prompts, completions, extras = reward_inputs(trajectories, self.processing_class, instances)
        reward_rows = [{**row, **extra} for row, extra in zip(rows, extras)]
        rewards_per_func = self.trl_rewards(reward_rows, prompts, completions, completion_ids)
        failed = torch.tensor([t.env_failed for t in trajectories], device=rewards_per_func.device)
        rewards_per_func = rewards_per_func.masked_fill(self.accelerator.gather(failed).unsqueeze(1), torch.nan)
        batch = self._batch(trajectories, completion_ids, env_mask, logprobs)
        round_ = Round(rows, trajectories, rewards_per_func, batch, prompts, completions)
        self._log_mask_audit(round_)
        if self.model.training:  # trainers/checks.py: stop a run that can only train on nothing
            stop = self._degenerate.observe(torch.isnan(rewards_per_func).all(dim=1).tolist(), trajectories)
            if stop is not None:
                self._record(round_)
                raise DegenerateTrainingError(stop)
        return round_

    def rollout(self, rows: list[dict[str, Any]]) -> tuple[list[Trajectory], list[Any] | None]:
        """One episode per row with :class:`~trl_agentic.rollout.engine.RolloutEngine` (each row's columns reach
        the environment's ``reset``). Returns the trajectories and, for TRL's ``tools=``/``environment_factory=``,
        each rollout's environment instance (``None`` otherwise)."""
        if self.use_vllm and self.state.global_step != self._vllm_weights_step:
            self.vllm_generation.sync_weights()  # the policy moved since vLLM last got its weights
            self._vllm_weights_step = self.state.global_step
        engine = RolloutEngine(self._generator(), self.processing_class, self.environment,
                               self.rollout_settings, self._sync_any, eos_token_ids=self.eos_token_ids,
                               sync_max=self._sync_max)
        envs = trl_rollout_environments(self.environment, rows)  # TRL's tools= / environment_factory=
        prompts = copy.deepcopy([row.get("prompt", EMPTY_PROMPT) if envs else row["prompt"] for row in rows])
        trajectories = engine.run(prompts, [dict(row) for row in rows], environments=envs)
        self._log_rollout_metrics(trajectories)
        if self.args.log_completions:  # trl_agentic/trackers.py: turns, tools, observations in the completions table
            self.log_completion_columns(trajectory_columns(trajectories))
        if envs is None:
            return trajectories, None
        self.environments = [env.instance for env in envs]  # TRL's attribute: this process's rollouts' instances
        return trajectories, self.environments

    def _batch(self, trajectories: list[Trajectory], completion_ids: list[list[int]], env_mask: list[list[int]],
               logprobs: list[list[float]]) -> TRLBatch:
        """The round's batch as TRL's ``_generate_and_score_completions`` builds it (``grpo_trainer.py``,
        l. 2440-2935; keys in its order): prompts left-padded, completions right-padded (to a multiple of ``pad_to_multiple_of``), the
        env mask as ``tool_mask`` (padded with 1, as TRL's), ``num_items_in_batch = sum_all processes
        completion_mask * tool_mask``. Old log-probs when the policy moves before the batch is trained on
        (``gradient_accumulation_steps`` not a multiple of ``steps_per_generation * num_iterations``) or for vLLM's
        importance-sampling correction; the reference's when ``beta != 0``."""
        device = self.accelerator.device
        pad_id, multiple = self.processing_class.pad_token_id, self.pad_to_multiple_of
        prompt_ids = [t.prompt_ids for t in trajectories]
        data: dict[str, Any] = {
            "prompt_ids": pad(prompt_ids, pad_id, "left", multiple).to(device),
            "prompt_mask": pad([[1] * len(p) for p in prompt_ids], 0, "left", multiple).to(device),
            "completion_ids": pad(completion_ids, pad_id, "right", multiple).to(device),
            "completion_mask": pad([[1] * len(c) for c in completion_ids], 0, "right", multiple).to(device),
            "advantages": torch.zeros(len(trajectories), device=device),
        }
        tool_mask = pad(env_mask, 1, "right", multiple).to(device)
        loss_mask = data["completion_mask"] * tool_mask
        data["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        self._log_lengths(trajectories, env_mask)
        batch = TRLBatch(data)
        args = self.args
        correction = self.use_vllm and args.vllm_importance_sampling_correction
        if args.gradient_accumulation_steps % (args.steps_per_generation * self.num_iterations) != 0 or correction:
            data["old_per_token_logps"] = self.policy_logps(self.model, batch)
        sampling = None
        if self.use_vllm:  # vLLM's sampling log-probs (None where vLLM could not score a token: NaN)
            rows = [[float("nan") if x is None else x for x in row] for row in logprobs]
            sampling = pad(rows, 0.0, "right", multiple, torch.float32).to(device)
        if correction:
            data["importance_sampling_ratio"] = vllm_importance_sampling_ratio(
                data["old_per_token_logps"], sampling, loss_mask, args.vllm_importance_sampling_mode,
                args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max)
            self._log_importance_sampling(data["old_per_token_logps"], sampling, data["importance_sampling_ratio"],
                                          loss_mask.bool())
        if sampling is not None:
            data["sampling_per_token_logps"] = sampling
        if self.beta != 0.0:
            data["ref_per_token_logps"] = self.reference_logps(batch)
        data["tool_mask"] = tool_mask
        if data.get("old_per_token_logps") is not None and sampling is not None:
            self._log_logprob_gap(batch)
        return batch

    def _set_group_advantages(self, round_: Round) -> None:
        """GRPO's advantages (:func:`~trl_agentic.algorithms.advantages.group_advantages`, bit-equal to TRL's),
        grouped by ``num_generations`` (``num_generations_eval`` in evaluation, as TRL), with the std floor under
        ``zero_variance_groups="std_floor"``; then TRL's reward metrics and completions table."""
        group = self.num_generations if self.model.training else self.num_generations_eval
        floor = self.args.std_floor if self.args.zero_variance_groups == "std_floor" else 0.0
        advantages = group_advantages(round_.rewards_per_func, self.reward_weights, group,
                                      self.multi_objective_aggregation, self.scale_rewards, floor)
        round_.batch.advantages = self._local(advantages).to(round_.batch.advantages.device)
        zero_std = frac_reward_zero_std(round_.rewards_per_func, self.reward_weights, group,
                                        self.multi_objective_aggregation, self.scale_rewards)
        self._log_rewards(round_, advantages, zero_std)

    def _log_rewards(self, round_: Round, advantages: torch.Tensor, zero_std: float | None) -> None:
        """TRL's per-round reward metrics (``grpo_trainer.py`` l. 2820-2830): ``rewards/<name>/mean`` and ``/std``
        over the rows each function scored, ``reward`` and ``reward_std`` of the weighted sum over scorable rows,
        ``frac_reward_zero_std``; then the completions table (``advantages``: every process's, one per row)."""
        rewards_per_func = round_.rewards_per_func
        for i, name in enumerate(self.reward_func_names):
            self.log_metric(f"rewards/{name}/mean", torch.nanmean(rewards_per_func[:, i]).item())
            self.log_metric(f"rewards/{name}/std", nanstd(rewards_per_func[:, i]).item())
        rewards = self._global_rewards(round_)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        self.log_metric("reward", torch.nanmean(rewards).item())
        self.log_metric("reward_std", nanstd(rewards).item())
        if zero_std is not None:
            self.log_metric("frac_reward_zero_std", zero_std)
        self.log_round_table(round_.prompts, round_.completions, rewards_per_func, advantages)

    def _log_lengths(self, trajectories: list[Trajectory], env_mask: list[list[int]]) -> None:
        """TRL's length metrics (``grpo_trainer.py`` ``_generate``, l. 2276-2310), over all processes: a
        completion's length counts its sampled (trained) tokens; it is clipped when its trajectory did not end on its
        own (:attr:`~trl_agentic.Trajectory.truncated`: a turn, token or environment budget cut it). TRL's test, a
        last token that is neither an end id nor the pad id, would call clipped every trajectory that ends at a stop
        string such as ``</answer>``."""
        device = self.accelerator.device
        lengths = self.accelerator.gather(torch.tensor([sum(m) for m in env_mask], device=device)).float()
        prompt_tokens = self.accelerator.gather(torch.tensor([len(t.prompt_ids) for t in trajectories], device=device))
        prompt_tokens = prompt_tokens.sum()
        self.count_tokens(int((prompt_tokens + lengths.sum()).item()))
        self.log_metric("completions/mean_length", lengths.mean().item())
        self.log_metric("completions/min_length", lengths.min().item())
        self.log_metric("completions/max_length", lengths.max().item())
        clipped = self.accelerator.gather(torch.tensor([t.truncated for t in trajectories], device=device))
        self.log_metric("completions/clipped_ratio", clipped.float().mean().item())
        terminated = lengths[~clipped] if (~clipped).any() else torch.zeros(1, device=device)
        self.log_metric("completions/mean_terminated_length", terminated.mean().item())
        self.log_metric("completions/min_terminated_length", terminated.min().item())
        self.log_metric("completions/max_terminated_length", terminated.max().item())

    def _log_importance_sampling(self, old: torch.Tensor, sampling: torch.Tensor, ratio: torch.Tensor,
                                 mask: torch.Tensor) -> None:
        """TRL's vLLM metrics (``grpo_trainer.py`` l. 2860-2897): ``sampling/sampling_logp_difference/{mean,max}`` of
        ``|log pi_old - log pi_vllm|`` over trained tokens vLLM scored (mean over processes of each process's mean,
        as TRL), ``sampling/importance_sampling_ratio/{min,mean,max}`` of the correction (every sequence's for the
        sequence modes, trained tokens' for the token modes)."""
        device = self.accelerator.device
        delta = torch.abs(old - sampling)
        delta = delta[mask & ~torch.isnan(delta)]
        zero = torch.tensor(0.0, device=device)
        mean, largest = (delta.mean(), delta.max()) if delta.numel() else (zero, zero)
        self.log_metric("sampling/sampling_logp_difference/mean", self.accelerator.gather(mean).mean().item())
        self.log_metric("sampling/sampling_logp_difference/max", self.accelerator.gather(largest).max().item())
        flat = ratio.flatten() if ratio.size(1) == 1 else ratio[mask]
        stats = torch.stack([flat.min(), flat.mean(), flat.max()]) if flat.numel() else torch.zeros(3, device=device)
        gathered = self.accelerator.gather(stats.unsqueeze(0))
        kept = gathered[~torch.isnan(gathered).any(dim=1)]
        kept = kept if kept.numel() else torch.full((1, 3), torch.nan, device=device)
        self.log_metric("sampling/importance_sampling_ratio/min", kept[:, 0].min().item())
        self.log_metric("sampling/importance_sampling_ratio/mean", kept[:, 1].mean().item())
        self.log_metric("sampling/importance_sampling_ratio/max", kept[:, 2].max().item())

    def _log_rollout_metrics(self, trajectories: list[Trajectory]) -> None:
        total: Counter = Counter()
        for sums in gather_object([rollout_sums(trajectories)]):
            total.update(sums)
        metrics = metrics_from_sums(total)
        if getattr(self, "tools", None):  # TRL logs its tool metrics whenever it has tools
            metrics.update(trl_tool_metrics(total))
        for name, value in metrics.items():
            self.log_metric(name, value)

    def _generator(self) -> Generator:
        if self.use_vllm:
            return TRLVLLMGenerator(self)
        return HFGenerator(self.model, self.processing_class, self.generation_config,
                           unwrap=lambda: unwrap_for_generation(self))

    def _sync_any(self, local_active: bool) -> bool:
        if self.accelerator.num_processes == 1:
            return local_active
        flag = torch.tensor([int(local_active)], device=self.accelerator.device)
        return bool(self.accelerator.gather(flag).sum().item())

    def _sync_max(self, local: int) -> int:
        if self.accelerator.num_processes == 1:
            return local
        value = torch.tensor([local], device=self.accelerator.device)
        return int(self.accelerator.gather(value).max().item())

    # -- zero-variance groups --------------------------------------------------------------------------------
    def _local(self, global_values: torch.Tensor) -> torch.Tensor:
        """This process's slice of a tensor over the global batch."""
        local = len(global_values) // self.accelerator.num_processes
        start = self.accelerator.process_index * local
        return global_values[start : start + local]

    def _global_rewards(self, round_: Round) -> torch.Tensor:
        """Weighted sum of the reward functions, per completion of the global batch (NaN-skipping)."""
        weights = self.reward_weights.to(round_.rewards_per_func.device)
        return (round_.rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)

    def _groups_without_spread(self, round_: Round) -> torch.Tensor:
        """Per group of the global batch: no reward spread among its scorable completions (``zero_std_groups``)."""
        rewards = self._global_rewards(round_)
        rewards[torch.isnan(round_.rewards_per_func).all(dim=1)] = torch.nan  # unscorable: out, not 0
        return zero_std_groups(rewards, self.num_generations)

    def _dynamic_sampling(self, rows: list[dict[str, Any]], first: Round) -> TRLBatch:
        """DAPO dynamic sampling; see :mod:`trl_agentic.trainers.zero_variance`. Every process runs the same number
        of rounds (the decision reads the gathered rewards), so collective calls stay aligned."""
        group = self.num_generations
        self._record(first)
        rounds, keeps = [first.batch], [~self._groups_without_spread(first)]
        needed = keeps[0].numel()
        for extra in range(self.args.max_extra_generation_rounds):
            if sum(int(k.sum()) for k in keeps) >= needed:
                break
            round_ = self.generation_round(self._sample_more_rows(len(rows), extra))
            self._set_group_advantages(round_)
            self._record(round_)
            rounds.append(round_.batch)
            keeps.append(~self._groups_without_spread(round_))
        picked = pick_groups(keeps, needed)
        device = self.accelerator.device
        merged = merge_rounds(
            rounds, picked, group,
            gather=self.accelerator.gather,
            max_width=lambda w: int(self.accelerator.gather(torch.tensor([w], device=device)).max()),
            process_index=self.accelerator.process_index,
            pad_token_id=self.processing_class.pad_token_id,
        )
        kept = sum(int(k.sum()) for k in keeps)
        self.log_metric("agentic/zero_variance/dropped_groups", float(sum(int((~k).sum()) for k in keeps)))
        self.log_metric("agentic/zero_variance/extra_rounds", float(len(rounds) - 1))
        self.log_metric("agentic/zero_variance/shortfall_groups", float(max(0, needed - kept)))
        return merged

    def _sample_more_rows(self, local_size: int, extra_round: int) -> list[dict[str, Any]]:
        """Fresh rows for a dynamic-sampling round, laid out as TRL's sampler lays them out (each prompt
        ``num_generations`` times in a row over the global batch); the same draw on every process."""
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self.state.global_step * 101 + extra_round)
        num_groups = local_size * self.accelerator.num_processes // self.num_generations
        indices = torch.randint(len(self.train_dataset), (num_groups,), generator=generator).tolist()
        rows = [dict(self.train_dataset[i]) for i in indices for _ in range(self.num_generations)]
        start = self.accelerator.process_index * local_size
        return rows[start : start + local_size]

    def _log_mask_audit(self, round_: Round) -> None:
        """Count trained positions the model did not sample (:mod:`trl_agentic.rollout.audit`): must be 0.
        Logged as ``agentic/mask_audit``. With ``mask_observations=False`` observation positions are allowed."""
        trained = round_.batch.loss_mask.bool().cpu().tolist()
        bad = 0
        for row, t in zip(trained, round_.trajectories):
            if not self.args.mask_observations:
                row = [flag and (i >= len(t.env_mask) or t.env_mask[i] == 1) for i, flag in enumerate(row)]
            bad += unsampled_trained(t, row, self.eos_token_ids)
        total = self.accelerator.gather(torch.tensor([bad], device=self.accelerator.device)).sum().item()
        self.log_metric("agentic/mask_audit", float(total))

    def _log_logprob_gap(self, batch: TRLBatch) -> None:
        """The trainer/vLLM log-prob gap on trained (agent) tokens, over all processes
        (:func:`~trl_agentic.rollout.metrics.logprob_gap`): ``agentic/vllm_logprob_gap`` (mean |delta| per token) and
        ``agentic/vllm_logprob_gap_max``."""
        mask = batch.loss_mask
        mean, largest = logprob_gap(batch.old_logps, batch.sampling_logps, mask)
        count = float(mask.sum())
        local = torch.tensor([[mean * count, count, largest]], device=self.accelerator.device)
        total = self.accelerator.gather(local)
        self.log_metric("agentic/vllm_logprob_gap", (total[:, 0].sum() / total[:, 1].sum().clamp(min=1.0)).item())
        self.log_metric("agentic/vllm_logprob_gap_max", total[:, 2].max().item())

    def _record(self, round_: Round) -> None:
        """Append the round's trajectories, with their rewards and advantage, to ``trajectory_dir``."""
        directory = getattr(self.args, "trajectory_dir", None)
        if not directory or not round_.trajectories:
            return
        rewards = self._local(round_.rewards_per_func).cpu()
        total = self._local(self._global_rewards(round_)).cpu()
        advantages = row_advantages(round_.batch).cpu()
        names = list(self.reward_func_names)
        path = os.path.join(directory, f"trajectories-rank{self.accelerator.process_index}.jsonl")
        save_trajectories(round_.trajectories, path, extra={
            "step": self.state.global_step,
            "reward": [None if torch.isnan(rewards[i]).all() else float(total[i]) for i in range(len(total))],
            "rewards": [{n: (None if torch.isnan(v) else float(v)) for n, v in zip(names, r)} for r in rewards],
            "advantage": [float(a) for a in advantages],
        })

    # -- loss (hook of the boundary) -------------------------------------------------------------------------
    def loss(self, model: Any, batch: TRLBatch) -> torch.Tensor:
        """GRPO's loss. With ``kl_estimator="k3"`` (or ``beta=0``) it is TRL's code untouched
        (:meth:`~trl_agentic.compat.GRPOTrainerBoundary.trl_loss`); with ``k1``/``k2`` it is
        :meth:`clipped_loss` with that estimator (TRL's loss hard-codes k3)."""
        estimator = getattr(self.args, "kl_estimator", "k3")
        if self.beta == 0.0 or estimator == "k3":
            return self.trl_loss(model, batch)
        return self.clipped_loss(model, batch, kl_estimator=estimator)

    def clipped_loss(self, model: Any, batch: TRLBatch, kl_estimator: str | None = None) -> torch.Tensor:
        """The clipped policy loss with an optional KL term, as TRL 1.16's ``_compute_loss`` computes it for the
        clipped loss types (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``), with any KL estimator. With
        importance ratio ``rho_t = pi(y_t)/pi_old(y_t)`` (per token, or ``exp(mean_t log rho_t)`` per sequence for
        ``importance_sampling_level="sequence"``, GSPO), advantage ``A`` (per sequence, GRPO's, or per token, PPO's)
        and trained tokens ``m_t`` (sampled tokens only, observations excluded):

            L = agg_t m_t [ -min(rho_t A, clip(rho_t, 1-eps_low, 1+eps_high) A) * w_t + beta * KL_t * (rho_t) ]

        ``w_t`` is vLLM's importance-sampling correction when TRL applies it; the factor ``rho_t`` on the KL term
        only with ``use_bias_correction_kl``; ``KL_t = kl_penalty(logp, logp_ref, kl_estimator)`` (Schulman 2020)
        with ``r = logp_ref - logp``; ``agg`` per ``loss_type`` (:meth:`aggregate_like_trl`). With ``kl_estimator="k3"``
        this equals TRL's loss (a contract test checks every clipped loss type). Masked positions read the policy's
        own log-probs (ratio 1, KL 0), so a non-finite value there never reaches the loss or its gradient.
        """
        mask = batch.loss_mask.bool()
        logps, entropies = self.logps_and_entropies(model, batch)
        ratio = self.importance_weights(logps, batch)
        advantages = batch.advantages if batch.advantages.dim() == 2 else batch.advantages.unsqueeze(1)
        if advantages.size(1) > 1:
            advantages = zero_masked(advantages, mask)
        per_token = clipped_policy_loss(ratio, advantages, self.epsilon_low, self.epsilon_high)
        correction = batch.data.get("importance_sampling_ratio")
        if correction is not None:
            per_token = per_token * torch.where(mask, correction, torch.ones_like(correction))
        if kl_estimator is not None:
            ref = torch.where(mask, batch.ref_logps, logps.detach())
            per_token_kl = kl_penalty(logps, ref, kl_estimator)
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * ratio
            per_token = per_token + self.beta * per_token_kl
        clipped = ((ratio < 1 - self.epsilon_low) & (advantages < 0)) | ((ratio > 1 + self.epsilon_high) & (advantages > 0))
        logged = {"entropy": entropies, "clip_ratio/region_mean": clipped.float()}
        if kl_estimator is not None:
            logged["kl"] = per_token_kl
        for name, value in self._global_token_means(logged, mask).items():
            self.log_metric(name, value)
        return self.aggregate_like_trl(per_token, mask, batch)

    def _global_token_means(self, per_token: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
        """Each term's mean over the trained tokens of all processes, in one reduction (a (B, 1) term counts once
        per trained token)."""
        sums = [masked_sum(value.detach().expand_as(mask), mask) for value in per_token.values()]
        total = self.accelerator.reduce(torch.stack([*sums, mask.sum().float()]), reduction="sum")
        count = total[-1].clamp(min=1.0)
        return {name: (total[k] / count).item() for k, name in enumerate(per_token)}

    def _check_clipped_loss_settings(self) -> None:
        """:meth:`clipped_loss` implements TRL's clipped loss types and none of TRL's loss extras: refuse, before
        training, a setting it would ignore."""
        args = self.args
        if self.loss_type not in CLIPPED_LOSS_TYPES:
            raise ValueError(f"{self._clipped_loss_user()} supports loss_type in {CLIPPED_LOSS_TYPES}, got "
                             f"{self.loss_type!r}")
        unsupported = {
            "delta": args.delta is not None,
            "top_entropy_quantile": args.top_entropy_quantile < 1.0,
            "off_policy_mask_threshold": args.off_policy_mask_threshold is not None,
            "entropy_coef": args.entropy_coef != 0.0 or args.use_adaptive_entropy,
            "router_aux_loss_coef (a mixture-of-experts model)": self.aux_loss_enabled,
        }
        for name, used in unsupported.items():
            if used:
                raise ValueError(f"{self._clipped_loss_user()} does not support {name}; leave it at TRL's default")

    def _clipped_loss_user(self) -> str:
        return f"kl_estimator={getattr(self.args, 'kl_estimator', 'k3')!r}"
