"""What a trainer, or ``evaluate``, rolls out: chosen once, from the arguments, by :func:`choose_rollout`.

The kinds (one :class:`RolloutChoice` each): our environment (``environment=``), TRL's ``tools=`` /
``environment_factory=`` (or a :class:`~trl_agentic.environments.trl_environments.TRLEnvironments` given as
``environment``), a game with several seats (``environment=Seats(...)``), an agent of any framework (``agent=``). A
choice

- derives ``GRPOTrainer``'s keyword arguments as its kind needs them and checks them before TRL builds anything
  (:meth:`~RolloutChoice.trainer_kwargs`: a new dict; the caller's objects are left as they were);
- adapts the rollout settings to the tokenizer TRL loaded (:meth:`~RolloutChoice.rollout_settings`);
- builds its implementation of the rollout seam (:meth:`~RolloutChoice.seam`,
  :mod:`~trl_agentic.rollout.seam`), once, from the same :class:`SeamParts` for every kind.

Past construction no code asks which kind it runs: the seam answers for it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..agents.runner import Agent, AgentRollout
from ..agents.seam import AgentSeam
from ..environments.base import EnvironmentFactory
from ..environments.native_tools import ensure_response_parser
from ..environments.trl_environments import TRLEnvironments, trl_environments_of, trl_trainer_kwargs
from ..rewards.guard import guard_reward
from ..rollout.config import RolloutConfig, native_tool_fields
from ..rollout.engine import RolloutEngine
from ..rollout.engine_seams import EngineSeam, TRLToolsSeam
from ..rollout.generation import Generator
from ..rollout.seam import RolloutSeam
from ..rollout.seats import SeatEngine, Seats, SeatSeam, bound_players
from .checks import (
    check_agent_arguments,
    check_budget_holds_a_call,
    check_environment_arguments,
    check_response_parser,
    check_seat_arguments,
    datasets_of,
    uses_native_tool_calls,
)
from .wrong_kind import check_kinds


@dataclass(frozen=True)
class SeamParts:
    """What every kind of rollout seam is built from.

    Attributes:
        processing_class: The policy's tokenizer.
        config: The rollout settings.
        generator: The generation backend, built once.
        eos_token_ids: Every id that ends the model's generation.
        sync_any, sync_max: Agree with the other processes (whether any is still active; the largest integer);
            identity on one process (``None``).
        multi_process: Whether other processes generate with this one.
        prompt_column: The column that holds each row's prompt.
    """

    processing_class: Any
    config: RolloutConfig
    generator: Generator
    eos_token_ids: list[int]
    sync_any: Callable[[bool], bool] | None = None
    sync_max: Callable[[int], int] | None = None
    multi_process: bool = False
    prompt_column: str = "prompt"

    def engine(self, environment: EnvironmentFactory | TRLEnvironments) -> RolloutEngine:
        """The engine over ``environment`` (our factory, or TRL's environments)."""
        return RolloutEngine(self.generator, self.processing_class, environment, self.config, self.sync_any,
                             eos_token_ids=self.eos_token_ids, sync_max=self.sync_max)


class RolloutChoice(Protocol):
    """One kind of rollout, chosen by :func:`choose_rollout` (module docstring)."""

    def trainer_kwargs(self, kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
        """``GRPOTrainer``'s keyword arguments for this kind, checked, its reward functions guarded
        (:func:`~trl_agentic.rewards.guard.guard_reward`); ``config_class``: the trainer's config class."""
        ...

    def rollout_settings(self, config: RolloutConfig, processing_class: Any) -> RolloutConfig:
        """The rollout settings for the tokenizer (refused when it cannot parse this kind's tool calls); the
        trainers' and every other entry point's (:mod:`~trl_agentic.kinds.entry`)."""
        ...

    def check(self, datasets: dict[str, Any], reward_funcs: Any, rollout_mode: str | None) -> None:
        """Refuse, in one line, ``datasets`` (by name), ``reward_funcs`` or a ``rollout_mode`` that could only
        produce nothing to learn from (:mod:`~trl_agentic.kinds.checks`)."""
        ...

    def implied_fields(self, max_completion_length: int) -> dict[str, Any]:
        """The rollout fields this kind implies where the caller left them unset (native tool calls: chat
        rollouts; TRL's tools: TRL's tool-loop budgets)."""
        ...

    def reward_functions(self, funcs: list[Any], weights: list[float] | None) -> tuple[list[Any], list[float] | None]:
        """The reward functions and weights a run scores with: ``funcs``, then what the kind adds (TRL's
        ``get_reward`` of each environment class, weight 1)."""
        ...

    def environment_factory(self) -> EnvironmentFactory | TRLEnvironments | None:
        """The factory of the environments the engine runs (``None``: an agent runs its own loop); SFT replays
        demonstrations against it."""
        ...

    def seam(self, parts: SeamParts) -> RolloutSeam:
        """The rollout seam of this kind, built once from ``parts``."""
        ...


def choose_rollout(environment: Any, agent: Any, kwargs: dict[str, Any]) -> RolloutChoice | None:
    """The kind of rollout given by ``environment=``, ``agent=`` and ``GRPOTrainer``'s keyword arguments ``kwargs``
    (TRL's ``tools`` / ``environment_factory``), or ``None`` when none is given (the trainer is TRL's
    ``GRPOTrainer``). Arguments that name two kinds, or a value given under another kind's name
    (:func:`~trl_agentic.kinds.wrong_kind.check_kinds`), are refused."""
    tools, factory = kwargs.get("tools"), kwargs.get("environment_factory")
    check_kinds(environment=environment, environment_factory=factory, tools=tools, agent=agent)
    if agent is not None:  # an agent of any framework, through an OpenAI-compatible endpoint (agents/)
        agent = Agent.of(agent)
        given = [name for name, value in (("environment", environment), ("tools", tools),
                                          ("environment_factory", factory),
                                          ("rollout_func", kwargs.get("rollout_func"))) if value is not None]
        if given:
            raise ValueError(f"pass either agent= or {given[0]}=, not both: the agent runs its own loop and tools")
        return AgentChoice(agent)
    native = trl_environments_of(tools, factory, kwargs.get("args"))  # TRL's tools=/environment_factory=
    if native is not None and environment is not None:
        raise ValueError("pass either environment= (a trl_agentic Environment) or TRL's tools=/environment_factory=, "
                         "not both")
    if native is not None or isinstance(environment, TRLEnvironments):
        return TRLToolsChoice(native if native is not None else environment)
    if isinstance(environment, Seats):
        return SeatsChoice(environment)
    return EnvironmentChoice(environment) if environment is not None else None


def guarded_rewards(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with its reward functions guarded: a raising, hanging (past ``args.reward_timeout``) or
    non-finite reward is unscorable, as in evaluation (:mod:`~trl_agentic.rewards.guard`)."""
    funcs = kwargs.get("reward_funcs")
    timeout = getattr(kwargs.get("args"), "reward_timeout", None)
    guarded = ([guard_reward(f, timeout) for f in funcs] if isinstance(funcs, (list, tuple))
               else guard_reward(funcs, timeout))
    return {**kwargs, "reward_funcs": guarded}


def _no_rollout_func(kwargs: dict[str, Any]) -> None:
    if kwargs.get("rollout_func") is not None:
        raise ValueError("pass either environment= or rollout_func=, not both")


class EnvironmentChoice:
    """Our environment (a class or zero-argument factory of :class:`~trl_agentic.Environment`), through the
    engine (:class:`~trl_agentic.rollout.engine_seams.EngineSeam`)."""

    def __init__(self, environment: EnvironmentFactory) -> None:
        self.environment = environment

    def trainer_kwargs(self, kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
        """As given; an :class:`~trl_agentic.trainers.config.AgenticConfig` (it has ``use_tool_loop_defaults``) is
        copied with chat rollouts for native tool calls (a :class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`)."""
        args = kwargs.get("args")
        if uses_native_tool_calls(self.environment) and hasattr(args, "use_tool_loop_defaults"):
            args = copy.copy(args)
            args.use_tool_loop_defaults(trl_tools=False)
            kwargs = {**kwargs, "args": args}
        self.check(datasets_of(kwargs), kwargs.get("reward_funcs"), getattr(args, "rollout_mode", None))
        _no_rollout_func(kwargs)
        return guarded_rewards(kwargs)

    def rollout_settings(self, config: RolloutConfig, processing_class: Any) -> RolloutConfig:
        """As given, once native tool calls have a response template to be parsed with."""
        check_response_parser(self.environment, processing_class)
        return config

    def check(self, datasets: dict[str, Any], reward_funcs: Any, rollout_mode: str | None) -> None:
        """:func:`~trl_agentic.kinds.checks.check_environment_arguments`."""
        check_environment_arguments(self.environment, datasets, reward_funcs, rollout_mode, EngineSeam.reward_fields)

    def implied_fields(self, max_completion_length: int) -> dict[str, Any]:
        """Chat rollouts for native tool calls (a :class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`)."""
        return native_tool_fields(False, max_completion_length) if uses_native_tool_calls(self.environment) else {}

    def reward_functions(self, funcs: list[Any], weights: list[float] | None) -> tuple[list[Any], list[float] | None]:
        """As given."""
        return funcs, weights

    def environment_factory(self) -> EnvironmentFactory:
        """The environment as given."""
        return self.environment

    def seam(self, parts: SeamParts) -> RolloutSeam:
        """:class:`~trl_agentic.rollout.engine_seams.EngineSeam` over the engine."""
        return EngineSeam(parts.engine(self.environment), parts.prompt_column)


class TRLToolsChoice:
    """TRL's ``tools=`` / ``environment_factory=``, run by our engine
    (:class:`~trl_agentic.rollout.engine_seams.TRLToolsSeam`), as TRL's ``GRPOTrainer`` would run them."""

    def __init__(self, source: TRLEnvironments) -> None:
        self.source = source

    def trainer_kwargs(self, kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
        """What TRL 1.16's ``__init__`` derives from them (:func:`~trl_agentic.environments.trl_environments.
        trl_trainer_kwargs`), with ``args`` the trainer's config with TRL's tool-loop budgets
        (:meth:`~trl_agentic.trainers.config.AgenticConfig.for_trl_tools`)."""
        kwargs = {**kwargs, "args": config_class.for_trl_tools(kwargs.get("args"), kwargs.get("model"))}
        kwargs = trl_trainer_kwargs(self.source, kwargs)
        self.check(datasets_of(kwargs), kwargs.get("reward_funcs"), kwargs["args"].rollout_mode)
        _no_rollout_func(kwargs)
        return guarded_rewards(kwargs)

    def rollout_settings(self, config: RolloutConfig, processing_class: Any) -> RolloutConfig:
        """With the chat template TRL's ``GRPOTrainer`` renders tool rollouts with (TRL swaps Qwen3's for its
        training variant), once the tokenizer has a response template."""
        from ..compat import trl_tool_chat_template  # here: evaluate imports this module, and it never imports TRL

        ensure_response_parser(processing_class)
        template = trl_tool_chat_template(processing_class)
        if template is not None:
            config.chat_template_kwargs["chat_template"] = template
        check_budget_holds_a_call(self.source.all_tools(), processing_class, config.max_tokens_per_turn,
                                  config.chat_template_kwargs)
        return config

    def check(self, datasets: dict[str, Any], reward_funcs: Any, rollout_mode: str | None) -> None:
        """:func:`~trl_agentic.kinds.checks.check_environment_arguments`."""
        check_environment_arguments(self.source, datasets, reward_funcs, rollout_mode, TRLToolsSeam.reward_fields)

    def implied_fields(self, max_completion_length: int) -> dict[str, Any]:
        """TRL's tool loop: chat rollouts, one turn may use the whole budget, no turn limit but the budget."""
        return native_tool_fields(True, max_completion_length)

    def reward_functions(self, funcs: list[Any], weights: list[float] | None) -> tuple[list[Any], list[float] | None]:
        """``funcs``, then one ``get_reward`` column per environment class that has one, weight 1 after ``weights``
        (as :func:`~trl_agentic.environments.trl_environments.trl_trainer_kwargs` gives the trainers)."""
        extra = self.source.reward_functions()
        return [*funcs, *extra], None if weights is None else [*weights, *[1.0] * len(extra)]

    def environment_factory(self) -> TRLEnvironments:
        """TRL's tools and environment classes, a factory of one environment per rollout."""
        return self.source

    def seam(self, parts: SeamParts) -> RolloutSeam:
        """:class:`~trl_agentic.rollout.engine_seams.TRLToolsSeam` over the engine."""
        return TRLToolsSeam(parts.engine(self.source), self.source, parts.prompt_column)


class SeatsChoice:
    """A game with several seats (:class:`~trl_agentic.rollout.seats.Seats`), each row's run one trained seat's
    trajectory (:class:`~trl_agentic.rollout.seats.SeatSeam`)."""

    def __init__(self, seats: Seats) -> None:
        self.seats = seats

    def trainer_kwargs(self, kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
        """As given, checked (:func:`~trl_agentic.kinds.checks.check_seat_arguments`: the datasets, the rewards and
        the settings that would group a game's seats together)."""
        args = kwargs.get("args")
        check_seat_arguments(self.seats, datasets_of(kwargs), kwargs.get("reward_funcs"), args, SeatSeam.reward_fields)
        _no_rollout_func(kwargs)
        return guarded_rewards(kwargs)

    def rollout_settings(self, config: RolloutConfig, processing_class: Any) -> RolloutConfig:
        """As given."""
        return config

    def check(self, datasets: dict[str, Any], reward_funcs: Any, rollout_mode: str | None) -> None:
        """:func:`~trl_agentic.kinds.checks.check_seat_arguments` on the datasets and rewards."""
        check_seat_arguments(self.seats, datasets, reward_funcs, None, SeatSeam.reward_fields)

    def implied_fields(self, max_completion_length: int) -> dict[str, Any]:
        """None."""
        return {}

    def reward_functions(self, funcs: list[Any], weights: list[float] | None) -> tuple[list[Any], list[float] | None]:
        """As given."""
        return funcs, weights

    def environment_factory(self) -> EnvironmentFactory:
        """Refused: a demonstration replays one agent's trajectory, and a game has several seats."""
        raise ValueError("SFT replays one agent's demonstrations against its environment, not games with several "
                         "seats: pass the trained seat's recorded trajectories (Trajectory objects) without "
                         "environment=")

    def seam(self, parts: SeamParts) -> RolloutSeam:
        """:class:`~trl_agentic.rollout.seats.SeatSeam` over a :class:`~trl_agentic.rollout.seats.SeatEngine`, each
        seat's player bound to the rollout (a :class:`~trl_agentic.rollout.players.FrozenCopy` copies the policy
        here)."""
        players = bound_players(self.seats, parts.generator, parts.processing_class, parts.config)
        engine = SeatEngine(parts.generator, parts.processing_class, self.seats, players, parts.config,
                            parts.sync_any, parts.eos_token_ids, parts.sync_max)
        return SeatSeam(engine, parts.prompt_column)


class AgentChoice:
    """An agent of any framework, through the OpenAI-compatible endpoint
    (:class:`~trl_agentic.agents.seam.AgentSeam`)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def trainer_kwargs(self, kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
        """As given, checked (:meth:`check`); dynamic sampling, which draws rows again, is refused."""
        if getattr(kwargs.get("args"), "zero_variance_groups", "keep") == "dynamic_sampling":
            raise ValueError("zero_variance_groups='dynamic_sampling' is not supported with agent=; use 'keep' or "
                             "'std_floor'")
        self.check(datasets_of(kwargs), kwargs.get("reward_funcs"), None)
        return guarded_rewards(kwargs)

    def rollout_settings(self, config: RolloutConfig, processing_class: Any) -> RolloutConfig:
        """As given: the endpoint renders every request with the tokenizer's chat template."""
        return config

    def check(self, datasets: dict[str, Any], reward_funcs: Any, rollout_mode: str | None) -> None:
        """:func:`~trl_agentic.kinds.checks.check_agent_arguments` (the endpoint renders chat: any mode)."""
        check_agent_arguments(self.agent, datasets, reward_funcs, AgentSeam.reward_fields)

    def implied_fields(self, max_completion_length: int) -> dict[str, Any]:
        """None: the agent's requests say what they need."""
        return {}

    def reward_functions(self, funcs: list[Any], weights: list[float] | None) -> tuple[list[Any], list[float] | None]:
        """As given."""
        return funcs, weights

    def environment_factory(self) -> None:
        """None: the agent runs its own loop and tools."""
        return None

    def seam(self, parts: SeamParts) -> RolloutSeam:
        """:class:`~trl_agentic.agents.seam.AgentSeam` over a fresh endpoint."""
        runner = AgentRollout(self.agent, parts.processing_class, parts.config, parts.eos_token_ids)
        return AgentSeam(runner, parts.generator, parts.sync_any, parts.multi_process, parts.prompt_column)

