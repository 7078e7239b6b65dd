"""One multi-turn episode, as token ids and as text, plus JSONL save/load."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, get_args

StopReason = Literal["terminated", "env_truncated", "eos", "max_turns", "max_tokens", "env_error", "env_timeout"]
"""Why a trajectory ended:

- ``"terminated"``: the environment said the task ended (``StepResult.terminated``, e.g. an answer was given);
- ``"env_truncated"``: the environment cut the episode short for a reason of its own (``StepResult.truncated``);
- ``"eos"``: text mode, the model ended its text with an end-of-sequence id and the environment did not end the
  episode;
- ``"max_turns"``: ``max_turns`` model turns without an end;
- ``"max_tokens"``: the trajectory's token budget (``max_completion_length``) ran out, or, in chat mode, the last
  message was cut by the turn's budget (``max_tokens_per_turn``) before its end-of-turn token;
- ``"env_error"``: the environment raised or returned an ill-typed value (``Trajectory.error`` says which);
- ``"env_timeout"``: an environment call took longer than ``env_timeout``.
"""

STOP_REASONS: tuple[str, ...] = get_args(StopReason)
TRUNCATING: frozenset[str] = frozenset({"env_truncated", "max_turns", "max_tokens", "env_error", "env_timeout"})
"""Stop reasons after which the trajectory is ``truncated`` (it did not end on its own)."""
ENV_FAILURES: frozenset[str] = frozenset({"env_error", "env_timeout"})


@dataclass
class Trajectory:
    """A finished (or truncated) multi-turn rollout.

    Token layout: ``prompt_ids`` (masked) then ``completion_ids``, which interleave the model's sampled tokens
    (``env_mask == 1``) with observation tokens appended by the engine (``env_mask == 0``). Turn ``k``'s sampled
    tokens are ``completion_ids[turn_spans[k][0]:turn_spans[k][1]]``, and decode to ``actions[k]`` exactly.

    Attributes:
        prompt_ids: Token ids of the prompt (including text returned by ``Environment.reset``).
        completion_ids: Sampled and observation token ids, in order.
        env_mask: 1 for a token the model sampled, 0 for an observation token; same length as ``completion_ids``.
        logprobs: Log-probability of each sampled token when the generator reports it (vLLM; transformers in
            evaluation and ``run_rollouts``), ``None`` when it does not (the trainer's transformers path, which
            recomputes them); 0.0 at observation tokens, which were not sampled (``env_mask`` 0).
        turn_spans: ``(start, end)`` of each turn's sampled tokens within ``completion_ids``.
        actions: The text the model produced in each turn.
        observations: The observation text appended after each turn (``None`` where nothing was appended): in text
            mode the decoded observation tokens, in chat mode the message content (the chat template's role
            headers are in ``completion_ids`` only).
        turn_rewards: The reward of each turn, from every kind of rollout: ``StepResult.reward`` (our
            environments), ``_turn_reward()`` (TRL's environment classes that define it), the agent's
            ``turn_rewards`` function (agents: :class:`~trl_agentic.agents.runner.Agent`); 0.0 where none was given.
            Reward functions may read them (``TurnReward``); PPO's turn-level GAE and GiGPO add them to each turn's
            reward (``docs/credit.md``).
        turn_infos: ``StepResult.info`` of each turn; ``turn_infos[k]["state_key"]``, when the environment gives it
            (``StepInfo.state_key``, TRL classes' ``_state_key()``), keys the state turn ``k`` led to: the state turn
            ``k + 1`` starts from.
        stop_reason: Why the trajectory ended (:data:`StopReason`).
        prompt: The prompt (text or chat messages) with the text ``Environment.reset`` returned appended, as TRL
            appends it (to the last message's content): what reward functions receive as ``prompts``.
        events: Counts of rollout events (``env_error``, ``env_timeout``, ``observation_truncated``, ...).
        error: What went wrong when ``stop_reason`` is ``env_error`` or ``env_timeout`` (``""`` otherwise).
        messages: Native tool calls only: the conversation after the prompt as TRL's tool loop builds it, each
            turn's assistant message as the chat template's response template parsed it (``content``,
            ``tool_calls``) followed by the ``tool`` messages appended after it; what TRL reward functions receive
            as ``completions``.
        policy_version: The optimizer step whose weights sampled the run when a copy of the policy rolled it out
            (asynchronous rollouts, ``max_staleness >= 1``: :mod:`~trl_agentic.rollout.pipeline`); ``None``
            when the training model did.
        seat: The seat of a game with several seats this trajectory played (:mod:`trl_agentic.rollout.seats`): its
            own context, the other seats' moves among its observations; ``None`` for an environment of one agent.
            GRPO groups runs by prompt and seat.
        generated_ids: The ids the generator returned for each turn, before the engine's cut (at the first end id,
            stop string or budget); the reference of the mask audit (:mod:`trl_agentic.rollout.audit`). Not
            written to JSONL.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str | None] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_infos: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: StopReason | None = None
    prompt: Any = None
    events: dict[str, int] = field(default_factory=dict)
    error: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    policy_version: int | None = None
    seat: str | None = None
    generated_ids: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def truncated(self) -> bool:
        """The trajectory did not end on its own: a budget, the environment's truncation or a failure ended it."""
        return self.stop_reason in TRUNCATING

    @property
    def env_failed(self) -> bool:
        """The environment raised, returned garbage or timed out (the trajectory carries no learning signal)."""
        return self.stop_reason in ENV_FAILURES

    @property
    def num_turns(self) -> int:
        """Number of model turns generated."""
        return len(self.actions)

    @property
    def env_reward(self) -> float:
        """Sum of the environment's turn-level rewards."""
        return float(sum(self.turn_rewards))

    @property
    def num_agent_tokens(self) -> int:
        return int(sum(self.env_mask))

    @property
    def num_observation_tokens(self) -> int:
        return len(self.env_mask) - self.num_agent_tokens

    def training_rows(self) -> list["Trajectory"]:
        """The sequences the loss trains on for this run: the run itself (an agent's run: its segments,
        :meth:`~trl_agentic.agents.session.AgentTrajectory.training_rows`)."""
        return [self]

    def agent_segments(self) -> list[list[int]]:
        """The sampled ids of each turn, read back through ``turn_spans``."""
        return [self.completion_ids[start:end] for start, end in self.turn_spans]

    def count(self, event: str, n: int = 1) -> None:
        self.events[event] = self.events.get(event, 0) + n

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["generated_ids"]
        data["num_turns"] = self.num_turns
        data["env_reward"] = self.env_reward
        data["truncated"] = self.truncated
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        """The trajectory of a row written by :meth:`to_dict`; a missing or ill-typed field raises ``ValueError``
        naming it (:func:`row_problem`)."""
        problem = row_problem(data)
        if problem is not None:
            raise ValueError(problem)
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["turn_spans"] = [tuple(span) for span in fields.get("turn_spans", [])]
        return cls(**fields)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# field -> (what it must be, a check of one element); every one of them is a list
_LIST_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "prompt_ids": ("integers", _is_int),
    "completion_ids": ("integers", _is_int),
    "env_mask": ("0s and 1s", lambda v: _is_int(v) and v in (0, 1)),
    "logprobs": ("numbers or null", lambda v: v is None or _is_number(v)),
    "turn_spans": ("[start, end] pairs of integers",
                   lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(x) for x in v)),
    "actions": ("strings", lambda v: isinstance(v, str)),
    "observations": ("strings or null", lambda v: v is None or isinstance(v, str)),
    "turn_rewards": ("numbers", _is_number),
    "turn_infos": ("objects", lambda v: isinstance(v, dict)),
}


def row_problem(data: Any) -> str | None:
    """What makes ``data`` (a JSONL row) no trajectory, naming the field, or ``None`` when it is one: it needs
    ``prompt_ids``; each list field holds elements of its type; ``env_mask`` is as long as ``completion_ids``."""
    if not isinstance(data, dict):
        return f"a trajectory row is a JSON object, got {type(data).__name__}"
    if "prompt_ids" not in data:
        return "field 'prompt_ids' is missing"
    for name, (what, ok) in _LIST_FIELDS.items():
        if name in data:
            value = data[name]
            if not isinstance(value, list) or not all(ok(v) for v in value):
                return f"field {name!r} must be a list of {what}, got {json.dumps(value, default=str)[:60]}"
    for name, kind in (("stop_reason", (str, type(None))), ("error", str), ("events", dict), ("seat", (str, type(None)))):
        if name in data and not isinstance(data[name], kind):
            return f"field {name!r} has the wrong type ({type(data[name]).__name__})"
    if len(data.get("env_mask", [])) != len(data.get("completion_ids", [])):
        return "field 'env_mask' must be as long as 'completion_ids'"
    return None


def save_trajectories(trajectories: Iterable[Trajectory], path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Append trajectories to a JSONL file, one object per line (``extra`` is merged into each line, e.g. the
    training step and the reward)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for i, trajectory in enumerate(trajectories):
            row = trajectory.to_dict()
            if extra:
                row.update({k: (v[i] if isinstance(v, list) else v) for k, v in extra.items()})
            line = json.dumps(row, ensure_ascii=False, default=str)
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: \u-escaped, still valid JSON that loads back the same
                line = json.dumps(row, ensure_ascii=True, default=str)
            f.write(line + "\n")


def load_trajectories(path: str | Path) -> Iterator[dict[str, Any]]:
    """Read the rows written by :func:`save_trajectories` (dicts, with any extra keys kept)."""
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
