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
- ``train_dataset`` may be omitted with a single factory whose ``reset()`` writes the prompt (TRL's placeholder
  rows; ``max_steps`` required); ``args=None`` is TRL's default config (:func:`trl_trainer_kwargs`).
- reward functions receive ``environments=``: the instance of each rollout (the trainer passes them as a rollout
  field).

What changes with our engine: tool calls run concurrently (the methods of one instance in call order) under
``tool_timeout``, a malformed call is answered with an error instead of ending the rollout, and a ``reset`` or
factory that raises costs its rollout alone (``env_error``) instead of the batch, and an instance whose ``reset`` or
method raised or outlived its timeout is dropped instead of serving another rollout.
"""

from __future__ import annotations

import copy
import inspect
import threading
from typing import Any, Callable, Sequence

from .environment import StepResult
from .native_tools import ToolCallEnvironment, tool_methods


class TRLEnvironments:
    """TRL's ``tools`` and ``environment_factory``, as a factory of :class:`TRLEnvironment` (one per rollout).

    Args:
        tools: TRL's ``tools`` (standalone callables).
        environment_factory: TRL's ``environment_factory`` (a factory or a dict of them), or ``None``.
        tool_timeout: Seconds one tool call may take.
    """

    def __init__(self, tools: Sequence[Callable[..., Any]] | None = None,
                 environment_factory: Callable[[], Any] | dict[str, Callable[[], Any]] | None = None,
                 tool_timeout: float = 30.0) -> None:
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
        self.tool_timeout = tool_timeout
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
            self._pools[name] = [instance]
            if callable(getattr(type(instance), "get_reward", None)) and type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))

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
        super().__init__(source.tools, source.tool_timeout)
        self.source = source
        self.instance: Any = None
        self._name: str | None = None
        self._settled = True  # False while a call on the instance has not returned (or raised, or timed out)

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
        settled, self._settled = self._settled, False
        result = await super().step(message)
        self._settled = settled and not result.info.get("tool_timeout")  # a timed-out method may still be running
        return result

    def close(self) -> None:
        """Give the instance back for a later rollout, unless a call on it raised or is still running on an
        abandoned thread (a ``reset``/``step`` past ``env_timeout``, a method past ``tool_timeout``): then it is
        dropped, and the factory builds a fresh one when needed."""
        if self.instance is not None and self._settled:
            self.source.release(self._name, self.instance)


def _get_reward_function(cls: type) -> Callable[..., list[float | None]]:
    """TRL's ``get_reward`` column: the reward of each rollout whose environment is exactly ``cls``."""
    if inspect.iscoroutinefunction(cls.get_reward):

        async def get_reward(environments: list[Any], **kwargs: Any) -> list[float | None]:
            return [await e.get_reward() if type(e) is cls else None for e in environments]

    else:

        def get_reward(environments: list[Any], **kwargs: Any) -> list[float | None]:
            return [e.get_reward() if type(e) is cls else None for e in environments]

    get_reward.__name__ = cls.__name__
    return get_reward


def from_trainer_kwargs(kwargs: dict[str, Any], environment: Any, tool_timeout: float) -> TRLEnvironments | None:
    """Take TRL's ``tools`` and ``environment_factory`` out of a trainer's keyword arguments (so that TRL's own
    tool loop never sees them); ``None`` when neither was given."""
    tools, factory = kwargs.pop("tools", None), kwargs.pop("environment_factory", None)
    if not tools and factory is None:
        return None
    if environment is not None:
        raise ValueError("pass either environment= (a trl_agentic Environment) or TRL's tools=/environment_factory=, "
                         "not both")
    return TRLEnvironments(tools, factory, tool_timeout)


def trl_trainer_kwargs(native: TRLEnvironments, kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
    """The keyword arguments of ``GRPOTrainer`` with what TRL 1.16's ``__init__`` derives from ``tools`` /
    ``environment_factory``, for a trainer that runs them through our engine (TRL never sees them):

    - ``args``: :func:`agentic_config` (``None``: TRL's default config, ``"<model name>-GRPO"``);
    - ``reward_funcs``: the user's, then one ``get_reward`` column per environment class that has one, with weight
      1 after the user's ``reward_weights`` (whose length TRL checks against the user's functions alone);
    - ``train_dataset``: optional with one ``environment_factory`` whose ``reset()`` writes the prompt: TRL's
      placeholder rows (one empty user message each, one generation round's worth) and ``max_steps`` required.
    """
    kwargs = dict(kwargs)
    args = kwargs["args"] = agentic_config(kwargs.get("args"), config_class, kwargs.get("model"))
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


def agentic_config(args: Any, config_class: type, model: Any = None) -> Any:
    """TRL's ``GRPOConfig`` as ``config_class`` with the same values and TRL's tool-loop budgets: chat rollouts, one
    turn may use all of ``max_completion_length``, at most ``max_tool_calling_iterations + 1`` turns (unbounded in
    TRL when unset: then the token budget ends the rollout). ``None`` gives TRL's default config as
    ``config_class``, named as TRL names it (``"<model name>-GRPO"``, ``-PPO`` for PPO's); any other config is
    turned into an ``AgenticGRPOConfig``, and one already is returned as is."""
    import dataclasses

    from .trainers.grpo import AgenticGRPOConfig

    if isinstance(args, AgenticGRPOConfig):
        return args
    if args is None:
        name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "name_or_path", "")
        kind = config_class.__name__.removeprefix("Agentic").removesuffix("Config")  # GRPO or PPO
        length = config_class.__dataclass_fields__["max_completion_length"].default
        values: dict[str, Any] = {"output_dir": f"{str(name).split('/')[-1]}-{kind}"}
        iterations = None
    else:
        config_class = AgenticGRPOConfig
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
        values["generation_batch_size"] = None  # derived again from steps_per_generation (TRL rejects both set)
        iterations, length = getattr(args, "max_tool_calling_iterations", None), args.max_completion_length
    values.update(rollout_mode="chat", max_tokens_per_turn=length,
                  max_turns=iterations + 1 if iterations is not None else length)
    return config_class(**values)


def with_message_completions(func: Any) -> Any:
    """A TRL reward function that receives as ``completions``, for each rollout with native tool calls, its
    messages (its assistant turns with their parsed tool calls, and the tool results: ``Trajectory.messages``), as
    TRL's tool loop passes them; other completions are left as they are. Reward models and model ids are returned
    unchanged."""
    if isinstance(func, str) or not callable(func) or hasattr(func, "parameters"):  # an id or an nn.Module
        return func

    def messages(kwargs: dict[str, Any]) -> dict[str, Any]:
        if "trajectory" not in kwargs:
            return kwargs
        completions = [list(t.messages) if t.messages else c for t, c in zip(kwargs["trajectory"], kwargs["completions"])]
        return {**kwargs, "completions": completions}

    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):

        async def wrapped_async(**kwargs: Any) -> Any:
            return await func(**messages(kwargs))

        return _named(wrapped_async, func)

    def wrapped(**kwargs: Any) -> Any:
        return func(**messages(kwargs))

    return _named(wrapped, func)


def _named(wrapper: Any, func: Any) -> Any:
    """``wrapper`` under ``func``'s name (TRL logs each reward function under its ``__name__``)."""
    wrapper.__name__ = wrapper.__qualname__ = getattr(func, "__name__", type(func).__name__)
    wrapper.__doc__ = func.__doc__
    return wrapper
