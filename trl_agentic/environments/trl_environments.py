"""TRL 1.16's ``tools=`` and ``environment_factory=`` arguments, run by our rollout engine.

TRL's contract (``GRPOTrainer.__init__`` and ``_generate_and_score_completions`` in TRL 1.16), kept here:

- ``tools``: callables the model may call in every rollout.
- ``environment_factory``: a zero-argument factory, or a dict ``{name: factory}`` whose entry each dataset row picks
  with its ``environment`` column (that column is not passed to ``reset``). An instance must define ``reset``; its
  public methods (other than ``reset`` and ``get_reward``) are the tools of its rollouts, next to ``tools``.
  ``reset(**row)`` may return text, appended to the last user message of the prompt. Instances are built once and
  reused: each factory is probed once here (a broken factory fails before training), then instances are taken from a
  pool per rollout and given back when it ends.
- ``get_reward()`` on an environment class: one extra reward function per class, named after it, weight 1 after
  the user's ``reward_weights`` (which count the user's functions only), scoring the rollouts of exactly that class
  (``None`` for the others).
- a dataset row may lack ``prompt`` (e.g. a dict factory's dataset of ``environment`` names only): its prompt is
  one empty user message, and ``reset()`` writes the task;
- ``train_dataset`` may be omitted with a single factory whose ``reset()`` writes the prompt (TRL's placeholder
  rows; ``max_steps`` required); ``args=None`` is TRL's default config (:func:`trl_trainer_kwargs`).
- reward functions receive ``environments=``: the instance of each rollout (the trainer passes them as a rollout
  field).
- sync tools, ``reset`` and the factories run on the training thread, one after another; a malformed call ends the
  rollout; a row whose ``environment`` names no factory raises before the batch's rollouts.

Per-turn rewards and states (an extension TRL ignores, listed in ``docs/trl-differences.md``): a class may define
``_turn_reward(self) -> float`` and ``_state_key(self) -> str | None`` (sync or async, no arguments). TRL 1.16 never
calls them and never shows them to the model (it skips every method whose name starts with ``_``), so the class runs
in TRL's own ``GRPOTrainer`` unchanged; our engine calls both after every turn, once the turn's tool calls have run:
the first gives the turn's reward (``StepResult.reward``: ``Trajectory.turn_rewards``, read by PPO's turn-level GAE
and GiGPO), the second the key of the state the turn led to (``StepInfo.state_key``, GiGPO's anchor states). A call
that raises or returns another type costs its rollout (``env_error``), as a ``reset`` that raises does.

What changes with our engine (each listed, with the option that turns it off, in ``docs/trl-differences.md``):
every tool call, ``reset`` and the factory run under a timeout (``tool_timeout``, ``env_timeout``); a ``reset``,
factory or tool that raises or hangs costs its rollout (or its call) alone instead of the batch; an instance whose
``reset`` or method raised or outlived its timeout is dropped instead of serving another rollout; every tool's schema
is read at construction (:func:`~trl_agentic.environments.native_tools.check_tool_schema`), so a tool without a docstring or type
hints is refused before training instead of failing the first rollout.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
import threading
from typing import Any, Callable, Sequence

from .base import EnvironmentOutputError, StepResult, read_info
from .native_tools import ToolCallEnvironment, check_tool_schema, tool_methods

TURN_REWARD_METHOD = "_turn_reward"
"""The optional method of a TRL environment class that gives each turn's reward (module docstring)."""
STATE_KEY_METHOD = "_state_key"
"""The optional method of a TRL environment class that gives the key of the state each turn led to."""

EMPTY_PROMPT: list[dict[str, str]] = [{"role": "user", "content": ""}]
"""The prompt of a row without one (TRL 1.16: with ``environment_factory``, ``reset()`` may write the whole task)."""


class TRLEnvironments:
    """TRL's ``tools`` and ``environment_factory``, as a factory of :class:`TRLEnvironment` (one per rollout).

    Args:
        tools: TRL's ``tools`` (standalone callables).
        environment_factory: TRL's ``environment_factory`` (a factory or a dict of them), or ``None``.
        tool_timeout: Seconds one tool call may take.
        concurrent_sync_tools: Run sync tools concurrently on worker threads instead of one after another on the
            rollout's thread (TRL's way; ``reset`` and the factory always run there).
        answer_malformed_calls, check_argument_types: As :class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`'s
            (both off: TRL's behaviour).
    """

    def __init__(self, tools: Sequence[Callable[..., Any]] | None = None,
                 environment_factory: Callable[[], Any] | dict[str, Callable[[], Any]] | None = None,
                 tool_timeout: float = 30.0, concurrent_sync_tools: bool = False,
                 answer_malformed_calls: bool = False, check_argument_types: bool = False) -> None:
        self.tool_options = {"tool_timeout": tool_timeout, "sync_tools_on_caller_thread": not concurrent_sync_tools,
                             "answer_malformed_calls": answer_malformed_calls,
                             "check_argument_types": check_argument_types}
        self.tools = list(tools or [])
        if not all(callable(tool) for tool in self.tools):
            raise TypeError("tools= must be a list of functions (type hints and a Google-style docstring each)")
        self.multi = isinstance(environment_factory, dict)
        if environment_factory is None:
            factories: dict[str | None, Callable[[], Any]] = {}
        elif self.multi:
            factories = dict(environment_factory)
        else:
            factories = {None: environment_factory}
        if not all(callable(f) for f in factories.values()):
            raise TypeError("environment_factory= must be a class or zero-argument callable, or a dict of them")
        self.factories = factories
        self._pools: dict[str | None, list[Any]] = {}
        self._lock = threading.Lock()
        self.reward_classes: list[type] = []
        for name, factory in factories.items():
            try:
                instance = factory()
            except Exception as exc:  # the probe: a factory that cannot build one instance fails before training
                label = getattr(factory, "__name__", type(factory).__name__)
                raise ValueError(f"environment_factory {label!r} raised {type(exc).__name__}: {exc}; it must build "
                                 "an environment with no arguments") from exc
            if not callable(getattr(type(instance), "reset", None)):
                raise ValueError(f"the environment {type(instance).__name__} of environment_factory must define a "
                                 "reset(**row) method (TRL's contract)")
            check_turn_methods(type(instance))
            self._pools[name] = [instance]
            if callable(getattr(type(instance), "get_reward", None)) and type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))
        for tool in self.all_tools():  # TRL 1.16 checks no schema before the first rollout renders them
            check_tool_schema(tool)

    def all_tools(self) -> list[Callable[..., Any]]:
        """TRL's ``GRPOTrainer.tools``: the standalone tools, then the tool methods of each probed environment
        instance not already listed."""
        tools = list(self.tools)
        for pool in self._pools.values():
            tools += [method for method in tool_methods(pool[0]) if method not in tools] if pool else []
        return tools

    def check_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        """TRL's check before a batch's rollouts: with a dict ``environment_factory``, every row's ``environment``
        must name one of the factories (TRL 1.16 raises this ``ValueError`` at the first batch that has such a row,
        not at construction)."""
        if not self.multi:
            return
        for name in {row.get("environment") for row in rows}:
            if name not in self.factories:
                raise ValueError(f"Example has `environment={name!r}`, which is not among the environments passed to "
                                 f"`environment_factory`. Expected one of: {list(self.factories)}.")

    def classes(self) -> dict[str | None, type]:
        """The class of each environment (from the probed instances), by name (``None``: a single factory)."""
        return {name: type(pool[0]) for name, pool in self._pools.items() if pool}

    def __call__(self) -> "TRLEnvironment":
        return TRLEnvironment(self)

    def acquire(self, name: str | None) -> Any:
        """An idle instance of environment ``name`` (a new one when all are in use)."""
        with self._lock:
            pool = self._pools[name]
            if pool:
                return pool.pop()
        return self.factories[name]()

    def release(self, name: str | None, instance: Any) -> None:
        with self._lock:
            self._pools[name].append(instance)

    def reward_functions(self) -> list[Callable[..., list[float | None]]]:
        """TRL's reward functions for environments with ``get_reward``: one per class, named after it."""
        return [_get_reward_function(cls) for cls in self.reward_classes]


class TRLEnvironment(ToolCallEnvironment):
    """One rollout of TRL's environments: picks its instance at ``reset`` from the row's ``environment`` column
    (dict factories), exposes ``tools`` plus that instance's methods, and gives the instance back at ``close``.
    ``instance`` stays readable afterwards (reward functions receive it as ``environments``)."""

    def __init__(self, source: TRLEnvironments) -> None:
        super().__init__(source.tools, **source.tool_options)
        self.source = source
        self.instance: Any = None
        self._name: str | None = None
        self._settled = True  # False while a call on the instance has not returned (or raised, or timed out)

    @property
    def runs_on_caller_thread(self) -> bool:
        """Always: the factory and the instance's ``reset`` run where TRL runs them (whatever ``concurrent_sync_tools``
        says of the tools)."""
        return True

    def reset(self, **row: Any) -> str | None:
        source = self.source
        if source.multi:
            name = row.pop("environment", None)
            if name not in source.factories:
                raise ValueError(f"the row's environment={name!r} is not among the environments passed to "
                                 f"environment_factory: {list(source.factories)}")
        else:
            name = None
        if name not in source.factories:  # tools= alone: no environment instance
            return None
        self._name, self.instance = name, source.acquire(name)
        methods = tool_methods(self.instance)
        self.tools, self.sequential = source.tools + methods, methods
        self._settled = False
        text = self.instance.reset(**row)
        self._settled = True
        return text

    async def step(self, message: dict[str, Any]) -> StepResult:
        """The turn's tool calls (:class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`), then the
        instance's turn reward and state key when its class defines them (module docstring)."""
        settled, self._settled = self._settled, False
        result = await super().step(message)
        if self.instance is not None:
            await self._read_turn(result)
        self._settled = settled and not read_info(result.info).tool_timeout  # a timed-out method may still run
        return result

    async def _read_turn(self, result: StepResult) -> None:
        """``result`` with the instance's ``_turn_reward()`` as its reward and ``_state_key()`` as its
        ``info["state_key"]`` (each when its class defines it); a wrong type raises a one-line
        :class:`~trl_agentic.environments.base.EnvironmentOutputError` naming the method."""
        name = type(self.instance).__name__
        reward = await _call_turn_method(self.instance, TURN_REWARD_METHOD)
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
                raise EnvironmentOutputError(f"{name}.{TURN_REWARD_METHOD}() must return a finite number, got "
                                             f"{reward!r:.60} ({type(reward).__name__})")
            result.reward = float(reward)
        key = await _call_turn_method(self.instance, STATE_KEY_METHOD)
        if key is not None:
            if not isinstance(key, str):
                raise EnvironmentOutputError(f"{name}.{STATE_KEY_METHOD}() must return text equal for equal states "
                                             f"(a str) or None, got {type(key).__name__}")
            result.info["state_key"] = key

    def close(self) -> None:
        """Give the instance back for a later rollout, unless a call on it raised or is still running on an
        abandoned thread (a ``reset``/``step`` past ``env_timeout``, a method past ``tool_timeout``): then it is
        dropped, and the factory builds a fresh one when needed."""
        if self.instance is not None and self._settled:
            self.source.release(self._name, self.instance)


def _turn_method(cls: type, name: str) -> Callable[..., Any] | None:
    """The function ``name`` defined on ``cls`` (or a base), or ``None`` (an attribute that is not a function is not
    the extension)."""
    method = inspect.getattr_static(cls, name, None)
    return method if inspect.isfunction(method) else None


def check_turn_methods(cls: type) -> None:
    """``_turn_reward`` and ``_state_key``, where ``cls`` defines them, take no argument but ``self``; otherwise a
    one-line ``ValueError`` before training (TRL's ``get_reward`` takes none either)."""
    for name in (TURN_REWARD_METHOD, STATE_KEY_METHOD):
        method = _turn_method(cls, name)
        if method is None:
            continue
        try:
            inspect.signature(method).bind(None)
        except TypeError:
            raise ValueError(f"{cls.__name__}.{name} must take no argument but self (our engine calls it after every "
                             f"turn); define def {name}(self)") from None


async def _call_turn_method(instance: Any, name: str) -> Any:
    """The value of ``instance``'s extension method ``name`` (awaited when async), ``None`` when its class lacks it."""
    method = _turn_method(type(instance), name)
    if method is None:
        return None
    value = method(instance)
    return await value if inspect.isawaitable(value) else value


def _get_reward_function(cls: type) -> Callable[..., list[float | None]]:
    """TRL's ``get_reward`` column: the reward of each rollout whose environment is exactly ``cls``; ``None`` (not
    called) for a rollout whose environment failed (its ``trajectory`` says so), which trains nothing anyway and
    whose instance may be half set up."""

    def scored(environments: list[Any], trajectory: list[Any] | None) -> list[bool]:
        failed = [getattr(t, "env_failed", False) for t in trajectory or [None] * len(environments)]
        return [type(e) is cls and not f for e, f in zip(environments, failed)]

    if inspect.iscoroutinefunction(cls.get_reward):

        async def get_reward(environments: list[Any], trajectory: list[Any] | None = None,
                             **kwargs: Any) -> list[float | None]:
            return [await e.get_reward() if ok else None for e, ok in zip(environments, scored(environments, trajectory))]

    else:

        def get_reward(environments: list[Any], trajectory: list[Any] | None = None,
                       **kwargs: Any) -> list[float | None]:
            return [e.get_reward() if ok else None for e, ok in zip(environments, scored(environments, trajectory))]

    get_reward.__name__ = cls.__name__
    return get_reward


def trl_environments_of(tools: Any, environment_factory: Any, args: Any) -> TRLEnvironments | None:
    """TRL's ``tools`` and ``environment_factory`` of a trainer's arguments as one :class:`TRLEnvironments`, with
    the tool options of its ``args`` (``env_timeout / 2`` per tool call); ``None`` when neither was given."""
    if not tools and environment_factory is None:
        return None
    return TRLEnvironments(tools, environment_factory, tool_timeout=getattr(args, "env_timeout", 60.0) / 2,
                           concurrent_sync_tools=getattr(args, "concurrent_sync_tools", False),
                           answer_malformed_calls=getattr(args, "answer_malformed_tool_calls", False),
                           check_argument_types=getattr(args, "check_tool_argument_types", False))


def trl_trainer_kwargs(native: TRLEnvironments, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``GRPOTrainer`` with what TRL 1.16's ``__init__`` derives from ``tools`` /
    ``environment_factory``, for a trainer that runs them through our engine (TRL never sees them: they are left
    out); ``args`` is already the trainer's config (:meth:`~trl_agentic.trainers.config.AgenticConfig.for_trl_tools`):

    - ``reward_funcs``: the user's, then one ``get_reward`` column per environment class that has one, with weight
      1 after the user's ``reward_weights`` (whose length TRL checks against the user's functions alone);
    - ``train_dataset``: optional with one ``environment_factory`` whose ``reset()`` writes the prompt: TRL's
      placeholder rows (one empty user message each, one generation round's worth) and ``max_steps`` required.
    """
    kwargs = {name: value for name, value in kwargs.items() if name not in ("tools", "environment_factory")}
    args = kwargs["args"]
    funcs = kwargs.get("reward_funcs")
    funcs = [] if funcs is None else list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
    extra = native.reward_functions()
    if args.reward_weights is not None and extra:
        if len(args.reward_weights) != len(funcs):  # TRL's check and message
            raise ValueError(f"Number of reward weights ({len(args.reward_weights)}) must match number of reward "
                             f"functions ({len(funcs)})")
        args = kwargs["args"] = copy.copy(args)  # the caller's config is left as it was
        args.reward_weights = [*args.reward_weights, *[1.0] * len(extra)]
    kwargs["reward_funcs"] = [*funcs, *extra]
    if kwargs.get("train_dataset") is None and native.factories:
        kwargs["train_dataset"] = placeholder_dataset(native, args)
    return kwargs


def placeholder_dataset(native: TRLEnvironments, args: Any) -> Any:
    """TRL 1.16's rows for training without ``train_dataset`` (the environment owns the data; ``reset()`` returns
    the prompt): ``generation_batch_size // num_generations`` rows of one empty user message, cycled for
    ``max_steps``. TRL's errors when that cannot work."""
    from datasets import Dataset

    if native.multi:
        raise ValueError(
            "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
            "`environment` column to route each example to its environment. Provide a dataset, or pass a "
            "single environment factory."
        )
    if args.max_steps <= 0:
        raise ValueError(
            "When training without a `train_dataset` (the environment owns the data and returns the prompt "
            "from `reset()`), `max_steps` must be set to a positive value to define the training length. Set "
            "it via `GRPOConfig(max_steps=...)`."
        )
    rows = args.generation_batch_size // args.num_generations
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * rows})
