"""The config of a run with rollouts: ``GRPOConfig`` plus the rollout fields and what both trainers add
(:class:`AgenticConfig`; :class:`~trl_agentic.AgenticGRPOConfig` and :class:`~trl_agentic.AgenticPPOConfig` extend
it)."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from ..device import cpu_bf16_default
from ..rollout.config import ROLLOUT_DEFAULTS, RolloutConfig, RolloutFields, native_tool_fields

ASYNC_CORRECTIONS = ("decoupled", "behaviour", "none")
ASYNC_GENERATORS = ("thread", "process")


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
    group_by_length: bool = field(
        default=False,
        metadata={"help": "Order a round's samples by completion length (after TRL's shuffle, longest first) before "
                  "they are cut into micro-batches, and compute each micro-batch at its own longest completion "
                  "(the padding every row of it has is cut), the round's old and reference log-probs likewise in "
                  "chunks of rows of similar length: less padding computed. GRPO's loss is the same for every loss type but bnpo, which normalizes per "
                  "micro-batch (its weighting then follows the lengths), as PPO's value loss does. Default "
                  "(TRL's): random micro-batches, padded to the round's longest completion."},
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
    reward_timeout: float | None = field(
        default=600.0,
        metadata={"help": "Seconds a reward function's call may take; past it the call is abandoned and the batch is "
                  "scored one completion at a time, each within the same bound, so that only the completions it "
                  "hangs on are unscorable. The function then runs on a thread of its own. None: no bound, on the "
                  "training thread (TRL's behaviour)."},
    )
    health_warning_rounds: int = field(
        default=3,
        metadata={"help": "Warn once, in one line that names the likely cause and the fix, when this many generation "
                  "rounds in a row had every group's rewards equal (nothing to learn from), no tool call although "
                  "tools were offered, or every trajectory cut by a budget. 0: never warn."},
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

    max_staleness: int = field(
        default=0,
        metadata={"help": "Asynchronous rollouts (rollout/pipeline.py). 0 (default): each round's rollouts "
                  "are generated before it trains, as TRL. D >= 1: the next D rounds' rollouts (every turn and tool) "
                  "run on a background thread while this round trains; each sample is at most D optimizer steps "
                  "stale and corrected by async_correction. Transformers generation on a copy of the policy, on "
                  "every process (not with DeepSpeed ZeRO-3 or FSDP), or vLLM's server (use_vllm=True, "
                  "vllm_mode='server', max_staleness=1: weights pushed between rounds)."},
    )
    async_correction: str = field(
        default="decoupled",
        metadata={"help": "max_staleness >= 1: 'decoupled' (AReaL): clip against the proximal policy (the old "
                  "log-probs recomputed with the current weights) times TRL's importance weight proximal/behaviour "
                  "(vllm_importance_sampling_mode, _clip_min, _clip_max: token or sequence, truncate or mask); "
                  "'behaviour': clip against the generator's log-probs (TRL's AsyncGRPOTrainer); 'none': no "
                  "correction (an ablation)."},
    )
    async_generator: str = field(
        default="thread",
        metadata={"help": "max_staleness >= 1: where the copy of the policy generates. 'thread' (default): on the "
                  "background thread, in the training process (it shares the GIL with training). 'process': its "
                  "forward passes in a child process (spawned at the first rollout, ended when training stops), "
                  "reading the copy's weights from shared memory, one torch thread, seeded with seed; the rollout "
                  "loop (tools, environments) stays on the background thread."},
    )
    generator_cpu: int | None = field(
        default=None,
        metadata={"help": "max_staleness >= 1: pin the background generator's thread (and, with "
                  "async_generator='process', its process) to this CPU core plus the process's local index (with "
                  "several processes on a machine, each pins to a core of its own: generator_cpu, generator_cpu + 1, "
                  "...; Linux; the training thread keeps the process's cores). None: no pinning."},
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
        if self.reward_timeout is not None and (isinstance(self.reward_timeout, bool) or not isinstance(
                self.reward_timeout, (int, float)) or not self.reward_timeout > 0):
            raise ValueError(f"reward_timeout must be a positive number of seconds or None, got {self.reward_timeout!r}")
        if isinstance(self.health_warning_rounds, bool) or not isinstance(self.health_warning_rounds, int) \
                or self.health_warning_rounds < 0:
            raise ValueError(f"health_warning_rounds must be an integer >= 0 (0: never warn), got "
                             f"{self.health_warning_rounds!r}")
        self._check_async_fields()
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

    def _check_async_fields(self) -> None:
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0: synchronous; D: the generator D rounds "
                             f"ahead), got {self.max_staleness!r}")
        if self.async_correction not in ASYNC_CORRECTIONS:
            raise ValueError(f"async_correction must be one of {ASYNC_CORRECTIONS}, got {self.async_correction!r}")
        if self.async_generator not in ASYNC_GENERATORS:
            raise ValueError(f"async_generator must be one of {ASYNC_GENERATORS}, got {self.async_generator!r}")
        if self.max_staleness and self.use_vllm:
            if self.vllm_mode != "server":
                raise ValueError("max_staleness >= 1 with use_vllm=True generates on vLLM's server while this process "
                                 "trains (colocate mode would share the training device): pass vllm_mode='server' "
                                 "(trl vllm-serve on devices of its own) or max_staleness=0")
            if self.max_staleness > 1:
                raise ValueError("max_staleness >= 2 with vLLM's server: the server holds one set of weights, which a "
                                 "second job queued would change under the first; pass max_staleness=1")
            if self.async_generator != "thread":
                raise ValueError("async_generator='process' runs transformers' generation in a child process; with "
                                 "use_vllm=True vLLM's server generates: leave async_generator='thread'")

    def rollout_config(self) -> RolloutConfig:
        """What the engine runs with (validated; ``max_tokens_per_turn`` clamped to ``max_completion_length``)."""
        return RolloutConfig.from_fields(self)

    def use_tool_loop_defaults(self, trl_tools: bool) -> None:
        """Native tool calls imply chat rollouts: the rollout fields left unset take the values that make a TRL script
        behave as in TRL (:func:`~trl_agentic.rollout.config.native_tool_fields`: ``rollout_mode="chat"``; with
        TRL's ``tools=``/``environment_factory=`` (``trl_tools``) also TRL's tool-loop budgets). Fields the user set
        are kept (an explicit ``rollout_mode='text'`` is refused later)."""
        unset = getattr(self, "_unset_rollout_fields", ())
        implied = native_tool_fields(trl_tools, self.max_completion_length,
                                     getattr(self, "max_tool_calling_iterations", None))
        for name, value in implied.items():
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
