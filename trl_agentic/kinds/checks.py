"""Refuse, before training or evaluation, rollout arguments that could only produce nothing to learn from.

Each mistake below lets TRL's ``train()`` run to the end at loss 0 and grad norm 0 (every trajectory ends
``env_error``, every reward is ``None``, so every advantage is 0), or fails deep inside TRL. The checks are pure
functions of what the trainer (or ``evaluate``) is given; each raises one line that names the fix:

- :func:`~trl_agentic.environments.base.check_environment_factory`: ``environment=`` is a class or a zero-argument
  factory, not an instance, and its declared ``stop_strings`` are a list (a string would stop at each of its
  characters);
- :func:`check_prompt_column`: the dataset has the ``prompt`` column TRL's sampler reads;
- :func:`check_rollout_mode`: native tool calls run in ``rollout_mode='chat'``;
- :func:`check_response_parser`: native tool calls have a response template to parse them with;
- :func:`check_budget_holds_a_call`: a turn's token budget holds the shortest tool call the chat template renders;
- :func:`check_reset_parameters`: every required parameter of ``reset()`` is a dataset column (and a dict
  ``environment_factory`` has the ``environment`` column);
- :meth:`~trl_agentic.agents.runner.Agent.check_columns`: every required parameter of an agent is a dataset column;
- :func:`check_reward_signatures`: each reward function can bind the keyword arguments TRL passes it;
- :func:`check_one_seat`: a game with several seats comes as ``Seats(game, players=...)``, and
  :func:`check_seat_arguments` refuses the trainer's settings that would group its seats together.

:func:`check_environment_arguments` (our environments and TRL's) and :func:`check_agent_arguments` run them on a
trainer's arguments, each dataset and the reward functions through :func:`check_datasets_and_rewards`; the kind of
rollout (:mod:`~trl_agentic.kinds.choice`) picks which. What only training can show is watched by the trainer
(:mod:`~trl_agentic.trainers.checks`).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..environments.base import check_environment_factory, environment_class
from ..rewards.guard import is_reward_model

# What TRL 1.16's GRPOTrainer passes every reward function, besides the dataset's columns (but "prompt") and our
# "trajectory" (compat.GRPOTrainerBoundary.trl_rewards); tests/trainers/test_checks.py checks it against a real step.
TRL_REWARD_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")

def dataset_columns(dataset: Any) -> list[str] | None:
    """A dataset's columns (``None``: not known, or a ``DatasetDict``, of which TRL wants one split); for a list of
    rows (dicts, as ``evaluate`` takes them), the columns every row has."""
    if isinstance(dataset, (list, tuple)):
        if not dataset or not all(isinstance(row, dict) for row in dataset):
            return None
        return [key for key in dataset[0] if all(key in row for row in dataset[1:])]
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, dict):  # a DatasetDict: TRL wants one split
        return None
    return list(columns) if columns is not None else None

def _prompt_fix(columns: Sequence[str]) -> str:
    hint = next((c for c in ("question", "query", "problem", "input", "text", "instruction") if c in columns), None)
    return f"dataset.rename_column({hint!r}, 'prompt')" if hint else "dataset.map(lambda row: {'prompt': ...})"


def check_prompt_column(dataset: Any, name: str = "train_dataset") -> None:
    """TRL's sampler reads each row's ``prompt``; a dataset without it fails inside TRL with ``KeyError``."""
    columns = dataset_columns(dataset)
    if columns is not None and "prompt" not in columns:
        raise ValueError(f"{name} has no 'prompt' column (it has {', '.join(columns) or 'none'}); add one, e.g. "
                         f"{_prompt_fix(columns)}")


def warn_without_prompt_column(dataset: Any, name: str = "train_dataset") -> None:
    """TRL's ``environment_factory=`` trains on a dataset without ``prompt``: each rollout starts from one empty user
    message, and only the text ``reset()`` returns tells the model the task (TRL 1.16 does the same, silently).
    Right when ``reset()`` writes the task; a mistake otherwise, so it is said once, with the fix."""
    columns = dataset_columns(dataset)
    if columns is not None and "prompt" not in columns:
        warnings.warn(f"{name} has no 'prompt' column (it has {', '.join(columns) or 'none'}): each rollout starts "
                      "from an empty user message and only the text reset() returns states the task, as in TRL. If "
                      f"reset() does not write the task, add a 'prompt' column, e.g. {_prompt_fix(columns)}",
                      stacklevel=2)

def _required_keywords(func: Any) -> tuple[list[str], bool]:
    """The parameters of ``func`` that have no default, and whether it takes ``**kwargs``."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return [], True
    required = [p.name for p in params
                if p.default is inspect.Parameter.empty
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return required, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

def check_reset_parameters(environment: Any, dataset: Any, name: str = "train_dataset") -> None:
    """``reset(**row)`` is called with the row's columns: a required parameter no column fills (a typo in a column
    name) would end every trajectory with ``env_error``. For TRL's ``environment_factory``, every environment class
    is checked, and a dict of factories needs the ``environment`` column that picks each row's."""
    from ..environments.trl_environments import TRLEnvironments

    columns = dataset_columns(dataset)
    if columns is None:
        return
    if isinstance(environment, TRLEnvironments):
        if environment.multi and "environment" not in columns:
            raise ValueError(f"a dict environment_factory picks each row's environment by its 'environment' column, "
                             f"which {name} lacks (columns: {', '.join(columns)}); add it, e.g. "
                             f"dataset.add_column('environment', [...]) with names from {list(environment.factories)}")
        classes = list(environment.classes().values())
    else:
        classes = [environment_class(environment)]
    for cls in classes:
        if cls is None or not callable(getattr(cls, "reset", None)):
            continue
        required, _ = _required_keywords(cls.reset)
        missing = [p for p in required[1:] if p not in columns]  # [0] is self
        if missing:
            raise ValueError(f"{cls.__name__}.reset() needs {', '.join(missing)}, which no dataset column provides "
                             f"(columns: {', '.join(columns)}); rename the column or give the parameter a default")

def uses_native_tool_calls(environment: Any) -> bool:
    """Whether the environment's actions are native tool calls: TRL's ``tools=`` / ``environment_factory=``, or a
    class (or ``functools.partial`` of one) whose ``action_format`` is ``"message"``
    (:class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`)."""
    from ..environments.trl_environments import TRLEnvironments

    cls = environment_class(environment)
    return isinstance(environment, TRLEnvironments) or getattr(cls, "action_format", "text") == "message"

def check_rollout_mode(environment: Any, rollout_mode: str | None) -> None:
    """Native tool calls (:func:`uses_native_tool_calls`) are chat messages rendered by the chat template: in
    ``rollout_mode='text'`` no call would ever be parsed, and every trajectory would end after its first turn.
    ``None``: not known yet."""
    if uses_native_tool_calls(environment) and rollout_mode not in (None, "chat"):
        raise ValueError(f"native tool calls need rollout_mode='chat' (the chat template renders the tools and their "
                         f"results), got {rollout_mode!r}: pass rollout_mode='chat' (--rollout_mode chat)")

def check_response_parser(environment: Any, processing_class: Any) -> None:
    """Native tool calls are parsed by the chat template's response template
    (:func:`~trl_agentic.environments.native_tools.ensure_response_parser`, which sets TRL's when the family is known): a
    template TRL knows none for would fail at the first rollout. Raises its one-line ``ValueError``."""
    if processing_class is not None and uses_native_tool_calls(environment):
        from ..environments.native_tools import ensure_response_parser

        ensure_response_parser(processing_class)

def check_budget_holds_a_call(tools: Sequence[Any], processing_class: Any, max_tokens_per_turn: int,
                              chat_template_kwargs: dict[str, Any] | None = None) -> None:
    """A turn of at most ``max_tokens_per_turn`` sampled tokens (already clamped to ``max_completion_length``) must
    hold the shortest tool call the chat template renders (any tool, no arguments, through the end-of-turn token):
    otherwise every call is cut before it closes and the run trains on truncated turns alone. Templates whose
    rendering cannot be measured (not prefix-preserving, or rendering fails) are not checked."""
    if not tools or processing_class is None:
        return
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    kwargs = {"tools": list(tools), "tokenize": True, "return_dict": False, **(chat_template_kwargs or {})}
    prompt = [{"role": "user", "content": "x"}]
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    lengths = {}
    for tool in tools:
        name = getattr(tool, "__name__", None)
        if not isinstance(name, str):
            return
        call = {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {}}}]}
        try:
            before = list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **kwargs))
            after = list(tokenizer.apply_chat_template([*prompt, call], **kwargs))
        except Exception:  # noqa: BLE001 - a template that cannot render this: not checked here
            return
        if after[: len(before)] != before:
            return
        turn = after[len(before):]
        end = next((i + 1 for i, token in enumerate(turn) if token in eos), len(turn))
        lengths[name] = end
    if lengths and max_tokens_per_turn < min(lengths.values()):
        name = min(lengths, key=lengths.get)
        raise ValueError(f"a turn may sample at most {max_tokens_per_turn} tokens, but the shortest tool call this "
                         f"chat template renders ({name}() without arguments) takes {lengths[name]}: every call would "
                         f"be cut before it closes. Raise max_completion_length (and max_tokens_per_turn) to at least "
                         f"{lengths[name]}, plus room for the arguments")

def check_reward_signatures(reward_funcs: Any, dataset: Any, extra_fields: Iterable[str] = ()) -> None:
    """Each reward function is called as ``f(prompts=..., completions=..., completion_ids=..., trainer_state=...,
    log_extra=..., log_metric=..., <every dataset column but prompt>=..., <extra_fields>=...)``; one that cannot
    take these would fail on every call, leaving every reward ``None``."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    columns = dataset_columns(dataset)
    passed = [*TRL_REWARD_KWARGS, *extra_fields, *[c for c in columns or () if c not in ("prompt", "completion")]]
    for func in funcs:
        if is_reward_model(func) or not callable(func):
            continue
        name = getattr(func, "__name__", type(func).__name__)
        try:
            params = inspect.signature(func).parameters
        except (TypeError, ValueError):
            continue
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            missing = []
        else:
            missing = [k for k in passed if k not in params] if columns is not None else []
        required, _ = _required_keywords(func)
        unfilled = [k for k in required if k not in passed] if columns is not None else []
        if missing or unfilled:
            what = (f"does not accept {', '.join(missing)}" if missing
                    else f"needs {', '.join(unfilled)}, which TRL does not pass (no such dataset column)")
            raise TypeError(f"reward function {name!r} {what}; TRL calls it with keyword arguments "
                            f"({', '.join(passed)}): add **kwargs to its signature")

def datasets_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The datasets among ``GRPOTrainer``'s keyword arguments, by name: ``train_dataset``, ``eval_dataset`` (each
    ``eval_dataset[<key>]`` of a dict); those not given are left out."""
    given = {"train_dataset": kwargs.get("train_dataset")}
    evals = kwargs.get("eval_dataset")
    given.update({f"eval_dataset[{k!r}]": v for k, v in evals.items()} if isinstance(evals, dict)
                 else {"eval_dataset": evals})
    return {name: dataset for name, dataset in given.items() if dataset is not None}

def check_datasets_and_rewards(datasets: dict[str, Any], reward_funcs: Any, reward_fields: Sequence[str],
                               check_dataset: Callable[[Any, str], None]) -> None:
    """``check_dataset(dataset, name)`` on every dataset of ``datasets`` (by name: ``train_dataset``, ...; the rows
    of ``evaluate``), then the reward functions' signatures against the first one's columns and ``reward_fields``
    (the keyword arguments the rollout adds)."""
    for name, dataset in datasets.items():
        check_dataset(dataset, name)
    first = next(iter(datasets.values()), None)
    check_reward_signatures(reward_funcs, first, extra_fields=reward_fields)

def check_environment_arguments(environment: Any, datasets: dict[str, Any], reward_funcs: Any,
                                rollout_mode: str | None, reward_fields: Sequence[str]) -> None:
    """Every check of a run with an environment (ours or TRL's) before anything is built: its ``datasets`` (by
    name), ``reward_funcs``, ``rollout_mode`` (``None``: not known yet); ``reward_fields``: the keyword arguments the
    rollout adds for the reward functions."""
    from ..environments.trl_environments import TRLEnvironments

    check_environment_factory(environment)
    check_one_seat(environment)
    check_rollout_mode(environment, rollout_mode)

    def check_dataset(dataset: Any, name: str) -> None:
        if isinstance(environment, TRLEnvironments):  # TRL's environments may write the prompt in reset()
            if environment.factories:
                warn_without_prompt_column(dataset, name)
        else:
            check_prompt_column(dataset, name)
        check_reset_parameters(environment, dataset, name)

    check_datasets_and_rewards(datasets, reward_funcs, reward_fields, check_dataset)

def check_one_seat(environment: Any) -> None:
    """``environment=`` given a game with several seats (a class with ``seats``): its ``reset`` answers whose turn it
    is, which an environment of one agent never does, so every trajectory would end ``env_error``."""
    cls = environment_class(environment)
    if cls is not None and getattr(cls, "seats", ()):
        raise ValueError(f"{cls.__name__} is a game with several seats ({', '.join(map(str, cls.seats))}): pass "
                         f"environment=Seats({cls.__name__}, players={{seat: 'policy' | FrozenCopy() | ...}}) "
                         "(from trl_agentic.rollout.seats import Seats)")


def check_seat_arguments(seats: Any, datasets: dict[str, Any], reward_funcs: Any, args: Any,
                         reward_fields: Sequence[str]) -> None:
    """Every check of a game with several seats (:class:`~trl_agentic.rollout.seats.Seats`) before anything is built:
    each dataset has a ``prompt`` and the columns the game's ``reset`` needs; the reward functions' signatures; and
    the trainer's settings that would group a game's seats together, each refused in one line naming what to pass:
    GiGPO's step groups, dynamic sampling's and ``normalize_then_sum``'s groups of ``num_generations`` runs, and GRPO
    groups per prompt and seat of fewer than two runs (``num_generations`` below twice the trained seats)."""
    trained = len(seats.trained)
    if getattr(args, "gigpo", False):
        raise ValueError("gigpo=True groups the steps of a group's runs by state, which a game's seats would share: "
                         "pass gigpo=False with Seats")
    if getattr(args, "zero_variance_groups", "keep") == "dynamic_sampling":
        raise ValueError("zero_variance_groups='dynamic_sampling' keeps whole groups of num_generations runs, which a "
                         "game's seats split: pass zero_variance_groups='keep' or 'std_floor' with Seats")
    if getattr(args, "multi_objective_aggregation", "sum_then_normalize") == "normalize_then_sum":
        raise ValueError("multi_objective_aggregation='normalize_then_sum' normalizes within groups of "
                         "num_generations runs, which a game's seats split: pass 'sum_then_normalize' with Seats")
    generations = getattr(args, "num_generations", None)
    if getattr(args, "seat_baseline", None) == "group" and generations is not None and generations < 2 * trained:
        raise ValueError(f"num_generations={generations} with {trained} trained seats leaves a group per prompt and "
                         f"seat of {generations // trained} run: nothing to compare with; pass num_generations="
                         f"{2 * trained} (or a larger multiple of {trained}), or seat_baseline='rae'")

    def check_dataset(dataset: Any, name: str) -> None:
        check_prompt_column(dataset, name)
        check_reset_parameters(seats.game, dataset, name)

    check_datasets_and_rewards(datasets, reward_funcs, reward_fields, check_dataset)


def check_agent_arguments(agent: Any, datasets: dict[str, Any], reward_funcs: Any,
                          reward_fields: Sequence[str]) -> None:
    """Every check of a run with ``agent=`` (an :class:`~trl_agentic.agents.runner.Agent`) before anything is built:
    its ``datasets`` (by name) and ``reward_funcs``; ``reward_fields``: the keyword arguments the rollout adds."""

    def check_dataset(dataset: Any, name: str) -> None:
        check_prompt_column(dataset, name)
        agent.check_columns(dataset_columns(dataset), name)

    check_datasets_and_rewards(datasets, reward_funcs, reward_fields, check_dataset)
