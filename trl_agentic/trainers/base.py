"""What both trainers share: the config fields of a run with rollouts, and the stages of a generation round.

:class:`AgenticTrainer` is TRL's ``GRPOTrainer`` (through :class:`~trl_agentic.compat.GRPOTrainerBoundary`) plus the
stages a round of our own is made of; :class:`~trl_agentic.AgenticGRPOTrainer` and
:class:`~trl_agentic.AgenticPPOTrainer` are siblings that compose them in their ``training_batch``, read top to
bottom in one file each:

1. :meth:`~AgenticTrainer.rollout`: one run per dataset row (the engine, or an agent through the endpoint);
2. :meth:`~AgenticTrainer.score`: TRL's reward functions on each run (what they receive:
   :func:`~trl_agentic.rewards.inputs.reward_inputs`, shared with evaluation);
3. :meth:`~AgenticTrainer.build_round`: the runs as training rows and TRL's batch (padding and masks only);
4. :meth:`~AgenticTrainer.add_logps`: the model forwards a round needs (old, reference and vLLM's log-probs);
5. the algorithm's advantages (the sibling's own);
6. :meth:`~AgenticTrainer.round_metrics` and the sibling's, logged once (:meth:`~AgenticTrainer.log_metrics`), then
   :meth:`~AgenticTrainer.record`.

State: built once per run (in ``__init__``): the environment factory or agent, the rollout settings
(:class:`~trl_agentic.rollout.config.RolloutConfig`), the generator (transformers' ``generate`` with its stop-criteria
cache, or TRL's vLLM backend), the engine (:class:`~trl_agentic.rollout.engine.RolloutEngine`: its observation
encoder's template probes), the degenerate-run monitor.
Per round: everything in :class:`~trl_agentic.trainers.round.Round`. Across rounds: only the global step whose
weights vLLM holds, and the monitor's count of unscorable rounds in a row.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOConfig

from ..agents.checks import prepare_agent_kwargs
from ..agents.runner import AgentRollout
from ..algorithms.advantages import combined_rewards, nanstd
from ..algorithms.importance import importance_ratio, vllm_importance_sampling_ratio
from ..algorithms.kl import kl_penalty
from ..algorithms.losses import aggregate_loss, clipped_policy_loss
from ..algorithms.masked import masked_sum, zero_masked
from ..compat import GRPOTrainerBoundary, TRLBatch, check_trl_version, trl_tool_chat_template, unwrap_for_generation
from ..device import cpu_bf16_default
from ..environments.base import EnvironmentFactory
from ..environments.native_tools import ensure_response_parser
from ..environments.trl_environments import (
    EMPTY_PROMPT,
    from_trainer_kwargs,
    trl_rollout_environments,
    trl_trainer_kwargs,
)
from ..rewards.guard import guard_reward
from ..rewards.inputs import reward_inputs
from ..rollout.audit import unsampled_trained
from ..rollout.config import ROLLOUT_DEFAULTS, RolloutConfig, RolloutFields
from ..rollout.engine import RolloutEngine
from ..rollout.generation import Generator, HFGenerator
from ..rollout.metrics import logprob_gap, metrics_from_sums, rollout_sums, trl_tool_metrics
from ..rollout.vllm import TRLVLLMGenerator
from ..trackers import trajectory_columns
from ..trajectory import Trajectory, save_trajectories
from .checks import (
    DegenerateStepMonitor,
    DegenerateTrainingError,
    check_response_parser,
    keyword_arguments,
    run_construction_checks,
    uses_native_tool_calls,
)
from .round import Round, pad, row_advantages, row_count, training_rows, trl_completion_rows, values_of_rows

CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the loss types of AgenticTrainer.clipped_loss


@dataclass
class AgenticConfig(GRPOConfig, RolloutFields):
    """``GRPOConfig`` plus what every run with rollouts has: the rollout fields (:class:`RolloutFields`, declared
    once), what the loss trains on, where trajectories go, TRL's tool options and when to stop a run that trains
    nothing. :class:`~trl_agentic.AgenticGRPOConfig` and :class:`~trl_agentic.AgenticPPOConfig` add their own."""

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
    max_degenerate_steps: int = field(
        default=3,
        metadata={"help": "Stop training after this many generation rounds in a row in which no completion could be "
                  "scored (every trajectory ended env_error/env_timeout, or every reward was None): such a round "
                  "trains nothing. The error quotes the first failure and where the trajectories are. 0: never stop."},
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

    def __post_init__(self) -> None:
        # Rollout fields left unset take the generic defaults now, and TRL's tool-loop values if the trainer turns out
        # to run TRL's tools=/environment_factory= (:meth:`use_tool_loop_defaults`).
        self._unset_rollout_fields = tuple(name for name in ROLLOUT_DEFAULTS if getattr(self, name) is None)
        for name in self._unset_rollout_fields:
            setattr(self, name, ROLLOUT_DEFAULTS[name])
        if self.activation_checkpointing is None:  # TRL's default sets the name transformers deprecates: pass the new
            self.activation_checkpointing = self.gradient_checkpointing  # one, so no FutureWarning nobody can act on
        self.bf16 = cpu_bf16_default(self.bf16, self.fp16, self.use_cpu)  # TRL's bf16=True, but not on a CPU
        super().__post_init__()
        self.rollout_config()  # validates the rollout fields
        if isinstance(self.max_degenerate_steps, bool) or not isinstance(self.max_degenerate_steps, int) \
                or self.max_degenerate_steps < 0:
            raise ValueError(f"max_degenerate_steps must be an integer >= 0 (0: never stop), got "
                             f"{self.max_degenerate_steps!r}")
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

    def rollout_config(self) -> RolloutConfig:
        """What the engine runs with (validated; ``max_tokens_per_turn`` clamped to ``max_completion_length``)."""
        return RolloutConfig.from_fields(self)

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

    @classmethod
    def for_trl_tools(cls, args: Any, model: Any = None) -> "AgenticConfig":
        """The config of a run of TRL's ``tools=`` / ``environment_factory=``, with TRL's tool-loop budgets in the
        rollout fields left unset (:meth:`use_tool_loop_defaults`). ``None`` gives TRL's default config as ``cls``,
        named as TRL names it (``"<model name>-GRPO"``, ``-PPO`` for PPO's); a TRL ``GRPOConfig`` becomes a ``cls``
        with the same values; an agentic config is copied (the caller's object is left as it was)."""
        if isinstance(args, AgenticConfig):
            args = copy.copy(args)
        elif args is None:
            name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "name_or_path", "")
            kind = cls.__name__.removeprefix("Agentic").removesuffix("Config")  # GRPO or PPO
            args = cls(output_dir=f"{str(name).split('/')[-1]}-{kind}")
        else:
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init and f.name in names}
            values["generation_batch_size"] = None  # derived again from steps_per_generation (TRL rejects both set)
            args = cls(**values)
        args.use_tool_loop_defaults(trl_tools=True)
        return args


class AgenticTrainer(GRPOTrainerBoundary):
    """The stages of a round with rollouts (module docstring), shared by the GRPO and PPO trainers. Without an
    environment or an agent it is TRL's ``GRPOTrainer``, untouched.

    Args:
        environment: A class or zero-argument factory returning a fresh :class:`~trl_agentic.Environment` per
            trajectory. ``None`` keeps plain ``GRPOTrainer`` behaviour (unless TRL's ``tools=`` /
            ``environment_factory=`` or ``agent=`` are given).
        agent: Instead of ``environment``, an agent of any framework, ``async def agent(client, **row)``, trained
            through an OpenAI-compatible endpoint in front of the policy (:mod:`trl_agentic.agents`,
            ``docs/agents.md``); reward functions also receive ``agent_output``.
        task: Optional :class:`~trl_agentic.tasks.Task`: the model card then states its tool protocol, its prompt and
            how to run the trained agent (:mod:`trl_agentic.model_card`).
        *args, **kwargs: As ``GRPOTrainer``.
    """

    config_class: type = AgenticConfig  # the default config when args=None with tools=/environment_factory=

    def __init__(self, *args: Any, environment: EnvironmentFactory | None = None, agent: Any = None,
                 task: Any = None, **kwargs: Any) -> None:
        check_trl_version()
        kwargs = keyword_arguments(args, kwargs)  # GRPOTrainer's arguments, all by name
        if agent is not None:  # an agent of any framework, through an OpenAI-compatible endpoint (agents/)
            agent = prepare_agent_kwargs(agent, environment, kwargs)
        native = from_trainer_kwargs(kwargs, environment)  # TRL's tools= / environment_factory=, run by our engine
        if native is not None:  # args, get_reward columns, reward_weights, train_dataset: as TRL derives them
            environment = native
            kwargs["args"] = self.config_class.for_trl_tools(kwargs.get("args"), kwargs.get("model"))
            kwargs = trl_trainer_kwargs(native, kwargs)
        elif uses_native_tool_calls(environment) and isinstance(kwargs.get("args"), AgenticConfig):
            kwargs["args"] = copy.copy(kwargs["args"])  # a ToolCallEnvironment implies chat rollouts
            kwargs["args"].use_tool_loop_defaults(trl_tools=False)
        self.environment, self.task = environment, task
        if environment is not None:
            fields = ("trajectory", "environments") if native is not None else ("trajectory",)
            run_construction_checks(environment, (), kwargs, fields)  # trainers/checks.py: fail before training
            if kwargs.get("rollout_func") is not None:
                raise ValueError("pass either environment= or rollout_func=, not both")
            funcs = kwargs.get("reward_funcs")
            kwargs["reward_funcs"] = ([guard_reward(f) for f in funcs] if isinstance(funcs, (list, tuple))
                                      else guard_reward(funcs))
        elif agent is None:
            self._check_trl_config(kwargs.get("args"))
        super().__init__(**kwargs)
        self.has_rollouts = environment is not None or agent is not None
        self._vllm_weights_step = -1  # the global step whose weights vLLM holds
        self.rollout_engine: RolloutEngine | None = None
        self.agent_rollout: AgentRollout | None = None
        if self.has_rollouts:
            self._check_agentic_args()
            self.degenerate_monitor = DegenerateStepMonitor(self.args.max_degenerate_steps, self.args.trajectory_dir)
            settings = self.args.rollout_config()
            check_response_parser(environment, self.processing_class)  # native tool calls: a response template
            if native is not None:
                ensure_response_parser(self.processing_class)
                self.tools = native.all_tools()  # TRL's attribute: the standalone tools and every environment's methods
                template = trl_tool_chat_template(self.processing_class)  # TRL swaps Qwen3's for its training variant
                if template is not None:
                    settings.chat_template_kwargs["chat_template"] = template
            self.generator = self._generator(settings)
            if agent is not None:
                self.agent_rollout = AgentRollout(agent, self.processing_class, settings, self.eos_token_ids)
            else:
                self.rollout_engine = RolloutEngine(self.generator, self.processing_class, environment, settings,
                                                    self._sync_any, eos_token_ids=self.eos_token_ids,
                                                    sync_max=self._sync_max)
        if self.beta != 0.0 and getattr(self.args, "kl_estimator", "k3") != "k3":
            self._check_clipped_loss_settings()

    def _check_trl_config(self, args: Any) -> None:
        """Without rollouts the trainer is TRL's: settings that only act on rollouts are refused."""

    def _check_agentic_args(self) -> None:
        if not isinstance(self.args, AgenticConfig):
            raise TypeError(f"environment= needs args={self.config_class.__name__}(...), got {type(self.args).__name__}")
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

    # -- the stages of a round -----------------------------------------------------------------------------------
    def generation_round(self, rows: list[dict[str, Any]]) -> Round:
        """Stages 1-4 of a round (module docstring): rollout, rewards, training rows and batch, log-probs. The
        batch's advantages are left at 0 for the sibling's step to set. A round in which nothing could be scored
        counts towards ``max_degenerate_steps`` (:class:`~trl_agentic.trainers.checks.DegenerateStepMonitor`)."""
        runs, environments = self.rollout(rows)
        if self.agent_rollout is not None and self.model.training:
            self.stop_if_refused(runs)
        prompts, completions, run_rewards = self.score(rows, runs, environments)
        round_ = self.build_round(rows, runs, run_rewards, prompts, completions)
        self.add_logps(round_.batch)
        if self.model.training:
            stop = self.degenerate_monitor.observe(torch.isnan(run_rewards).all(dim=1).tolist(), runs)
            if stop is not None:
                self.record(round_)
                raise DegenerateTrainingError(stop)
        return round_

    def stop_if_refused(self, runs: list[Any]) -> None:
        """Raise :class:`~trl_agentic.trainers.checks.DegenerateTrainingError` when no agent run of the round (on any
        process) reached the model and the endpoint refused some of their requests
        (:meth:`~trl_agentic.trainers.checks.DegenerateStepMonitor.observe_refusals`)."""
        local = [sum(any(s.turn_spans for s in t.segments) for t in runs),
                 sum(t.events.get("bad_request", 0) for t in runs)]
        total = self.accelerator.gather(torch.tensor([local], device=self.accelerator.device)).sum(0).tolist()
        first = next((t.refusal for t in runs if t.refusal), None)
        stop = self.degenerate_monitor.observe_refusals(int(total[0]), int(total[1]), first)
        if stop is not None:
            raise DegenerateTrainingError(stop)

    def rollout(self, rows: list[dict[str, Any]]) -> tuple[list[Trajectory], list[Any] | None]:
        """1. One run per row: the engine's episode (each row's columns reach the environment's ``reset``), or an
        agent's run against the endpoint. Returns the runs and, for TRL's ``tools=``/``environment_factory=``, each
        run's environment instance (TRL's ``trainer.environments``; ``None`` otherwise)."""
        if self.use_vllm and self.state.global_step != self._vllm_weights_step:
            self.vllm_generation.sync_weights()  # the policy moved since vLLM last got its weights
            self._vllm_weights_step = self.state.global_step
        if self.agent_rollout is not None:  # agents/runner.py: one agent run per row, against the endpoint
            runs = self.agent_rollout.run(rows, self.generator, self._sync_any,
                                          self.accelerator.num_processes > 1)
            return runs, None
        envs = trl_rollout_environments(self.environment, rows)  # TRL's tools= / environment_factory=
        prompts = copy.deepcopy([row.get("prompt", EMPTY_PROMPT) if envs else row["prompt"] for row in rows])
        runs = self.rollout_engine.run(prompts, [dict(row) for row in rows], environments=envs)
        if envs is None:
            return runs, None
        self.environments = [env.instance for env in envs]  # TRL's attribute: this process's rollouts' instances
        return runs, self.environments

    def score(self, rows: list[dict[str, Any]], runs: list[Trajectory],
              environments: list[Any] | None) -> tuple[list[Any], list[Any], torch.Tensor]:
        """2. TRL's reward functions on every run, with TRL's keyword arguments, ``trajectory`` (and
        ``agent_output`` for agents, ``environments`` for TRL's environments), built by
        :func:`~trl_agentic.rewards.inputs.reward_inputs` as in evaluation. A run whose environment (or agent) failed
        carries no learning signal: it is unscorable (NaN) for every function. Returns the prompts and completions
        the functions received (this process's) and the (R_global, num_reward_funcs) rewards."""
        agent = self.agent_rollout is not None
        given_prompts = copy.deepcopy([row["prompt"] for row in rows]) if agent else None
        prompts, completions, extras = reward_inputs(runs, self.processing_class, environments, given_prompts)
        if agent:
            extras = [{**extra, "agent_output": t.agent_output} for extra, t in zip(extras, runs)]
        reward_rows = [{**row, **extra} for row, extra in zip(rows, extras)]
        completion_ids = [list(t.completion_ids) for t in runs]
        rewards = self.trl_rewards(reward_rows, prompts, completions, completion_ids)
        failed = torch.tensor([t.env_failed for t in runs], device=rewards.device)
        return prompts, completions, rewards.masked_fill(self.accelerator.gather(failed).unsqueeze(1), torch.nan)

    def build_round(self, rows: list[dict[str, Any]], runs: list[Trajectory], run_rewards: torch.Tensor,
                    prompts: list[Any], completions: list[Any]) -> Round:
        """3. The runs as training rows (one per run; an agent run that rewrote its history gives one per segment,
        and padding rows make every process's count equal and divisible by ``steps_per_generation``:
        :func:`~trl_agentic.trainers.round.training_rows`) and TRL's batch of them (:meth:`build_batch`)."""
        rows_of_runs = [getattr(t, "segments", None) for t in runs]
        if any(rows_of_runs) or self.agent_rollout is not None:
            multiple = self.args.steps_per_generation if self.model.training else 1
            local = sum(max(1, len(segments or [])) for segments in rows_of_runs)
            count = row_count(local, self._sync_max, multiple)
            trajectories, owners = training_rows(runs, count, self._pad_id())
        else:
            trajectories, owners = list(runs), list(range(len(runs)))
        offset = self.accelerator.process_index * len(runs)
        local_rewards = run_rewards[offset: offset + len(runs)]
        row_rewards = values_of_rows(local_rewards, owners, torch.nan)
        if owners != list(range(len(runs))):  # a segment's own messages; its run's prompt
            prompts = [prompts[o] if o >= 0 else "" for o in owners]
            completions = [list(t.messages) for t in trajectories]
        round_ = Round(rows=rows, runs=runs, run_rewards=run_rewards, trajectories=trajectories, owners=owners,
                       rewards_per_func=self.accelerator.gather(row_rewards.to(self.accelerator.device)),
                       batch=self.build_batch(trajectories), prompts=prompts, completions=completions)
        if self.args.log_completions:  # trl_agentic/trackers.py: turns, tools, observations in the completions table
            self.log_completion_columns(trajectory_columns(trajectories))
        return round_

    def build_batch(self, trajectories: list[Trajectory]) -> TRLBatch:
        """The training rows as TRL's ``_generate_and_score_completions`` lays out a batch (``grpo_trainer.py``,
        l. 2440-2480; keys in its order): prompts left-padded, completions right-padded (to a multiple of
        ``pad_to_multiple_of``), the env mask as ``tool_mask`` (padded with 1, as TRL's; zero for a failed or, with
        ``mask_truncated_trajectories``, a truncated trajectory), vLLM's sampling log-probs, and
        ``num_items_in_batch = sum_all processes completion_mask * tool_mask``. Padding and masks only."""
        device, multiple = self.accelerator.device, self.pad_to_multiple_of
        completion_ids, env_mask, logprobs = trl_completion_rows(
            trajectories, self._pad_id(), self.args.mask_observations, self.args.mask_truncated_trajectories)
        prompt_ids = [t.prompt_ids for t in trajectories]
        data: dict[str, Any] = {
            "prompt_ids": pad(prompt_ids, self._pad_id(), "left", multiple).to(device),
            "prompt_mask": pad([[1] * len(p) for p in prompt_ids], 0, "left", multiple).to(device),
            "completion_ids": pad(completion_ids, self._pad_id(), "right", multiple).to(device),
            "completion_mask": pad([[1] * len(c) for c in completion_ids], 0, "right", multiple).to(device),
            "advantages": torch.zeros(len(trajectories), device=device),
        }
        if self.use_vllm:  # vLLM's sampling log-probs (None where vLLM could not score a token: NaN)
            values = [[float("nan") if x is None else x for x in row] for row in logprobs]
            data["sampling_per_token_logps"] = pad(values, 0.0, "right", multiple, torch.float32).to(device)
        data["tool_mask"] = pad(env_mask, 1, "right", multiple).to(device)
        batch = TRLBatch(data)
        batch.recount_items(self.accelerator.gather)
        return batch

    def add_logps(self, batch: TRLBatch) -> None:
        """4. The model forwards of a round, as TRL decides them: the policy's log-probs now (``old``) when it moves
        before the batch is trained on (``gradient_accumulation_steps`` not a multiple of ``steps_per_generation *
        num_iterations``) or for vLLM's importance-sampling correction (then the correction too); the reference's
        when ``beta != 0``."""
        args = self.args
        correction = self.use_vllm and args.vllm_importance_sampling_correction
        if args.gradient_accumulation_steps % (args.steps_per_generation * self.num_iterations) != 0 or correction:
            batch.old_logps = self.policy_logps(self.model, batch)
        if correction:
            batch["importance_sampling_ratio"] = vllm_importance_sampling_ratio(
                batch.old_logps, batch.sampling_logps, batch.loss_mask, args.vllm_importance_sampling_mode,
                args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max)
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self.reference_logps(batch)
        batch.in_trl_order()

    def record(self, round_: Round) -> None:
        """Append the round's training rows, with their run's rewards and their advantage (the batch's, one per row:
        :func:`~trl_agentic.trainers.round.row_advantages`), to ``trajectory_dir``."""
        directory = getattr(self.args, "trajectory_dir", None)
        if not directory or not round_.trajectories:
            return
        advantages = row_advantages(round_.batch)
        rewards = self._local(round_.rewards_per_func).cpu()
        total = self._local(self.combined_rewards(round_.rewards_per_func)).cpu()
        names = list(self.reward_func_names)
        path = os.path.join(directory, f"trajectories-rank{self.accelerator.process_index}.jsonl")
        save_trajectories(round_.trajectories, path, extra={
            "step": self.state.global_step,
            "reward": [None if torch.isnan(r) else float(r) for r in total],
            "rewards": [{n: (None if torch.isnan(v) else float(v)) for n, v in zip(names, r)} for r in rewards],
            "advantage": [float(a) for a in advantages.cpu()],
        })

    # -- metrics ------------------------------------------------------------------------------------------------
    def round_metrics(self, round_: Round) -> dict[str, float]:
        """A round's metrics that do not depend on the algorithm, over all processes: the rollout's (``agentic/*``,
        TRL's ``tools/*``), TRL's lengths (``completions/*``; the tokens are counted in ``num_tokens``), the mask
        audit, and with vLLM the sampling gap and TRL's importance-sampling metrics."""
        metrics = self.rollout_metrics(round_.runs)
        metrics.update(self.length_metrics(round_.trajectories, round_.batch))
        metrics["agentic/mask_audit"] = self.mask_audit(round_)
        batch = round_.batch
        if batch.old_logps is not None and batch.sampling_logps is not None:
            metrics.update(self.sampling_metrics(batch))
        return metrics

    def rollout_metrics(self, runs: list[Trajectory]) -> dict[str, float]:
        """``agentic/*`` (:mod:`~trl_agentic.rollout.metrics`) and, whenever the trainer has TRL's tools, TRL's
        ``tools/call_frequency`` and ``tools/failure_frequency``; for agents ``agentic/agent/*``."""
        total: Counter = Counter()
        for sums in gather_object([rollout_sums(runs)]):
            total.update(sums)
        metrics = metrics_from_sums(total)
        if getattr(self, "tools", None):
            metrics.update(trl_tool_metrics(total))
        if self.agent_rollout is not None:
            from ..agents.metrics import agent_metrics

            metrics.update(agent_metrics(runs, self.accelerator))
        return metrics

    def length_metrics(self, trajectories: list[Trajectory], batch: TRLBatch) -> dict[str, float]:
        """TRL's length metrics (``grpo_trainer.py`` ``_generate``, l. 2276-2310), over all processes, and the
        round's tokens added to TRL's ``num_tokens``: a completion's length counts its sampled (trained) tokens; it is
        clipped when its trajectory did not end on its own (:attr:`~trl_agentic.Trajectory.truncated`: a turn,
        token or environment budget cut it). TRL's test, a last token that is neither an end id nor the pad id,
        would call clipped every trajectory that ends at a stop string such as ``</answer>``."""
        device = self.accelerator.device
        lengths = self.accelerator.gather(batch.loss_mask.sum(dim=1).to(device)).float()
        prompt_tokens = self.accelerator.gather(torch.tensor([len(t.prompt_ids) for t in trajectories], device=device))
        self.count_tokens(int((prompt_tokens.sum() + lengths.sum()).item()))
        clipped = self.accelerator.gather(torch.tensor([t.truncated for t in trajectories], device=device))
        terminated = lengths[~clipped] if (~clipped).any() else torch.zeros(1, device=device)
        return {
            "completions/mean_length": lengths.mean().item(),
            "completions/min_length": lengths.min().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": clipped.float().mean().item(),
            "completions/mean_terminated_length": terminated.mean().item(),
            "completions/min_terminated_length": terminated.min().item(),
            "completions/max_terminated_length": terminated.max().item(),
        }

    def mask_audit(self, round_: Round) -> float:
        """Trained positions the model did not sample, over all processes (:mod:`trl_agentic.rollout.audit`): must be
        0. With ``mask_observations=False`` observation positions are allowed. The end ids are the engine's."""
        rollouts = self.rollout_engine if self.rollout_engine is not None else self.agent_rollout
        trained = round_.batch.loss_mask.bool().cpu().tolist()
        bad = 0
        for row, t in zip(trained, round_.trajectories):
            if not self.args.mask_observations:
                row = [flag and (i >= len(t.env_mask) or t.env_mask[i] == 1) for i, flag in enumerate(row)]
            bad += unsampled_trained(t, row, rollouts.eos_token_ids)
        return float(self.accelerator.gather(torch.tensor([bad], device=self.accelerator.device)).sum().item())

    def sampling_metrics(self, batch: TRLBatch) -> dict[str, float]:
        """With vLLM, over trained tokens and all processes: our ``agentic/vllm_logprob_gap`` (mean |delta| per
        token, :func:`~trl_agentic.rollout.metrics.logprob_gap`) and ``_max``, and TRL's metrics (``grpo_trainer.py``
        l. 2860-2897): ``sampling/sampling_logp_difference/{mean,max}`` (mean over processes of each process's mean,
        as TRL) and, with the correction, ``sampling/importance_sampling_ratio/{min,mean,max}``."""
        device, mask = self.accelerator.device, batch.loss_mask
        mean, largest = logprob_gap(batch.old_logps, batch.sampling_logps, mask)
        count = float(mask.sum())
        total = self.accelerator.gather(torch.tensor([[mean * count, count, largest]], device=device))
        metrics = {"agentic/vllm_logprob_gap": (total[:, 0].sum() / total[:, 1].sum().clamp(min=1.0)).item(),
                   "agentic/vllm_logprob_gap_max": total[:, 2].max().item()}
        ratio = batch.data.get("importance_sampling_ratio")
        if ratio is None:
            return metrics
        mask = mask.bool()
        delta = torch.abs(batch.old_logps - batch.sampling_logps)
        delta = delta[mask & ~torch.isnan(delta)]
        zero = torch.tensor(0.0, device=device)
        mean, largest = (delta.mean(), delta.max()) if delta.numel() else (zero, zero)
        metrics["sampling/sampling_logp_difference/mean"] = self.accelerator.gather(mean).mean().item()
        metrics["sampling/sampling_logp_difference/max"] = self.accelerator.gather(largest).max().item()
        flat = ratio.flatten() if ratio.size(1) == 1 else ratio[mask]
        stats = torch.stack([flat.min(), flat.mean(), flat.max()]) if flat.numel() else torch.zeros(3, device=device)
        gathered = self.accelerator.gather(stats.unsqueeze(0))
        kept = gathered[~torch.isnan(gathered).any(dim=1)]
        kept = kept if kept.numel() else torch.full((1, 3), torch.nan, device=device)
        metrics["sampling/importance_sampling_ratio/min"] = kept[:, 0].min().item()
        metrics["sampling/importance_sampling_ratio/mean"] = kept[:, 1].mean().item()
        metrics["sampling/importance_sampling_ratio/max"] = kept[:, 2].max().item()
        return metrics

    def reward_metrics(self, rewards_per_func: torch.Tensor) -> dict[str, float]:
        """TRL's per-round reward metrics (``grpo_trainer.py`` l. 2820-2830) over the training rows of every
        process: ``rewards/<name>/mean`` and ``/std`` over the rows each function scored, ``reward`` and
        ``reward_std`` of the weighted sum over scorable rows."""
        metrics = {}
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
            metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
        rewards = self.combined_rewards(rewards_per_func)
        metrics["reward"] = torch.nanmean(rewards).item()
        metrics["reward_std"] = nanstd(rewards).item()
        return metrics

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Log a round's metrics, once; TRL averages and logs them with its own."""
        for name, value in metrics.items():
            self.log_metric(name, value)

    # -- helpers ------------------------------------------------------------------------------------------------
    def combined_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """The weighted sum of the reward functions per row (NaN-skipping; NaN where no function scored):
        :func:`~trl_agentic.algorithms.advantages.combined_rewards`."""
        return combined_rewards(rewards_per_func, self.reward_weights, 1)

    def _pad_id(self) -> int:
        pad_id = self.processing_class.pad_token_id
        return pad_id if pad_id is not None else self.eos_token_ids[0]

    def _generator(self, settings: RolloutConfig) -> Generator:
        if self.use_vllm:
            return TRLVLLMGenerator(self)
        return HFGenerator(self.model, self.processing_class, self.generation_config,
                           unwrap=lambda: unwrap_for_generation(self), keep_cache=settings.prefix_caching)

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

    def _local(self, global_values: torch.Tensor) -> torch.Tensor:
        """This process's slice of a tensor over the global batch."""
        local = len(global_values) // self.accelerator.num_processes
        start = self.accelerator.process_index * local
        return global_values[start : start + local]

    # -- the clipped policy loss (GRPO with k1/k2, PPO) -----------------------------------------------------------
    def clipped_loss(self, model: Any, batch: TRLBatch, kl_estimator: str | None = None) -> torch.Tensor:
        """The clipped policy loss with an optional KL term, as TRL 1.16's ``_compute_loss`` computes it for the
        clipped loss types (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``), with any KL estimator. With
        importance ratio ``rho_t = pi(y_t)/pi_old(y_t)`` (per token, or ``exp(mean_t log rho_t)`` per sequence for
        ``importance_sampling_level="sequence"``, GSPO), advantage ``A`` (per sequence, GRPO's, or per token, PPO's)
        and trained tokens ``m_t`` (sampled tokens only, observations excluded):

            L = agg_t m_t [ -min(rho_t A, clip(rho_t, 1-eps_low, 1+eps_high) A) * w_t + beta * KL_t * (rho_t) ]

        ``w_t`` is vLLM's importance-sampling correction when TRL applies it; the factor ``rho_t`` on the KL term
        only with ``use_bias_correction_kl``; ``KL_t = kl_penalty(logp, logp_ref, kl_estimator)`` (Schulman 2020)
        with ``r = logp_ref - logp``; ``agg`` per ``loss_type`` (:func:`~trl_agentic.algorithms.losses.aggregate_loss`).
        With ``kl_estimator="k3"`` this equals TRL's loss (a contract test checks every clipped loss type). Masked
        positions read the policy's own log-probs (ratio 1, KL 0), so a non-finite value there never reaches the
        loss or its gradient.
        """
        mask = batch.loss_mask.bool()
        logps, entropies = self.logps_and_entropies(model, batch)
        ratio = importance_ratio(logps, batch.old_logps, batch.loss_mask, self.importance_sampling_level)
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
        self.log_metrics(self._global_token_means(logged, mask))
        return self.aggregate_like_trl(per_token, mask, batch)

    def aggregate_like_trl(self, per_token: torch.Tensor, mask: torch.Tensor, batch: TRLBatch) -> torch.Tensor:
        """Reduce a (B, T) per-token term as TRL 1.16's ``_compute_loss`` reduces its per-token loss for the
        configured ``loss_type`` (:func:`~trl_agentic.algorithms.losses.aggregate_loss`), so that a term added here
        equals the same term added inside TRL's loss (checked against TRL's own k3 term for every loss type)."""
        training = self.model.training
        return aggregate_loss(
            per_token, mask, self.loss_type,
            accumulation=self.current_gradient_accumulation_steps if training else 1.0,
            max_completion_length=self.max_completion_length, num_items=batch.num_items_in_batch,
            num_processes=self.accelerator.num_processes, steps_per_generation=self.args.steps_per_generation,
            training=training)

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
