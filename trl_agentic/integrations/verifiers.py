"""A verifiers v1 environment (``import verifiers.v1 as vf``; the library of Prime Intellect's Environments Hub),
trained and evaluated unchanged.

    env = VerifiersEnvironment.load("my-env", config={"agent": {"runtime": {"type": "subprocess"}}})
    trainer = AgenticGRPOTrainer(model=..., args=..., train_dataset=env.dataset(), agent=env.agent,
                                 reward_funcs=env.reward)

What carries over, and how:

- **Tasks -> rows.** :meth:`VerifiersEnvironment.dataset` iterates the taskset (``iter(env.taskset)``: each task's
  ``idx`` set, the config's system prompt applied) into rows: ``prompt`` (the task's system and user prompt, as chat
  messages: what TRL logs) and ``verifiers_task`` (the task's data as JSON). The agent rebuilds the task from that
  JSON as verifiers' own env server does (the taskset's ``TaskData`` type validated, wrapped in its ``Task`` type
  with the config's task settings), so the rows survive TRL's sampler, shuffling and ``num_generations`` copies.
- **Model calls -> the policy.** :meth:`VerifiersEnvironment.agent` runs one episode per row with
  ``Env.run_episode(task, ModelContext(...))``. The context's client is an ``EvalClientConfig`` whose ``base_url`` is
  the trajectory's own base URL on the OpenAI-compatible endpoint (``/t/<key>/v1``, :mod:`trl_agentic.agents`):
  whatever dialect the harness speaks (chat completions, Responses, Anthropic Messages) and however verifiers'
  interception server relays it, every call of one rollout lands in that rollout's trajectory, token-exact, and no
  other (a per-rollout client; verifiers' ``X-Session-ID`` header is sent too, and not needed).
- **Serving.** ``Env.serving()`` (the interception server, the taskset's shared tool servers, ``Env.start`` /
  ``stop``) is held while any episode of a round runs and released when the last one ends, so the per-rollout
  clients verifiers caches per endpoint are closed every round (:class:`_Serving`).
- **Reward.** :class:`VerifiersReward` returns each episode's ``Trace.reward`` (verifiers' weighted sum of its
  ``@vf.reward`` functions) and logs each component's score as ``verifiers/<name>`` and each ``@vf.metric`` as
  ``verifiers/metric/<name>`` (also columns of TRL's completions table).
- **Failures cost their trajectory.** An episode whose harness, task hook or scoring failed (``Episode.errors``,
  ``Trace.errors``) makes the agent raise :class:`VerifiersEpisodeError` with verifiers' own message: the trajectory
  ends with ``env_error`` (unscorable, no gradient), the other rollouts of the round go on.
- **One trained seat per episode, other seats played by their players.** An environment of several seats
  (``AgentConfig`` fields: ``user-sim``'s assistant and simulated user, a solver and a judge) trains the one seat the
  policy plays: every other seat is played by a player of ``players=`` (a
  :class:`~trl_agentic.rollout.players.ScriptedPlayer` or :class:`~trl_agentic.rollout.players.ModelPlayer`,
  served to the seat's harness by a :class:`~trl_agentic.integrations.seat_server.SeatServer`: the seat's config
  gets that server as its client), or by the model its own config pins (``client``). The trained seat's trace is the
  run's (its reward, its model calls through the endpoint); the others' calls never reach the policy. A seat the
  environment's ``setup()`` marks not trainable (``agents.user.trainable = False``) cannot be the policy's, and
  verifiers' ``best-of-n`` with ``n > 1`` (one seat run ``n`` times) is refused, each in one line when the
  environment is wrapped (:func:`_seating`).

What does not carry over is listed in ``docs/trl-differences.md`` (verifiers' sampling settings, its retries, a
frozen copy of the policy as a seat's player); ``docs/environments.md`` shows a whole run.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger(__name__)

TASK_COLUMN = "verifiers_task"
"""The dataset column that holds each row's task data, as JSON."""
KEY_VARIABLE = "TRL_AGENTIC_VERIFIERS_KEY"
"""The environment variable verifiers reads the endpoint's API key from. It is normally unset (verifiers then sends
``EMPTY``): the trajectory's key is in its base URL, which wins over the header."""
METRIC_PREFIX = "verifiers"


def _vf() -> Any:
    """``verifiers.v1``, or one line saying how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise ImportError("verifiers environments need the verifiers package: pip install 'trl-agentic[verifiers]' "
                          "(in a virtual environment of its own: verifiers pins openai<3)") from None
    return vf


class VerifiersEpisodeError(RuntimeError):
    """A verifiers episode failed (its harness, a task hook, scoring, the interception): its trajectory ends with
    ``env_error`` and this message."""


@dataclass(frozen=True)
class EpisodeResult:
    """What :meth:`VerifiersEnvironment.agent` returns for one episode: reward functions receive it as
    ``agent_output``. Plain values (it is written with the trajectory, as JSON).

    Attributes:
        reward: ``Trace.reward``: the sum of each ``@vf.reward``'s score times its weight.
        rewards: Each reward component's ``score`` and ``weight``.
        metrics: Each ``@vf.metric``'s value.
        stop_condition: What stopped the trace (``None``: the harness returned).
        reply: The trace's last reply.
        trace_id: The trace's id (verifiers' ``X-Session-ID``).
        turns: Model turns verifiers recorded.
    """

    reward: float
    rewards: dict[str, dict[str, float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    stop_condition: str | None = None
    reply: str = ""
    trace_id: str = ""
    turns: int = 0

    @classmethod
    def of(cls, trace: Any) -> "EpisodeResult":
        rewards = {name: {"score": float(r.score), "weight": float(r.weight)}
                   for name, r in trace.rewards.items() if r is not None}
        metrics = {name: float(value) for name, value in trace.metrics.items() if value is not None}
        return cls(reward=float(trace.reward), rewards=rewards, metrics=metrics, stop_condition=trace.stop_condition,
                   reply=trace.last_reply, trace_id=str(trace.id), turns=int(trace.num_turns))


class VerifiersReward:
    """A TRL reward function: each episode's verifiers reward (``agent_output.reward``, :class:`EpisodeResult`).

    Logged, when TRL passes ``log_metric`` / ``log_extra``: each reward component's mean score as
    ``verifiers/<name>`` (before its weight) and each metric's mean as ``verifiers/metric/<name>``, over the episodes
    that have it; each component's scores as a column of the completions table.
    """

    __name__ = "verifiers_reward"

    def __call__(self, completions: Sequence[Any], agent_output: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        if agent_output is None:
            raise ValueError("verifiers_reward reads agent_output: train with agent=VerifiersEnvironment(...).agent")
        results = [out if isinstance(out, EpisodeResult) else None for out in agent_output]
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        log_extra: Callable[[str, list], None] | None = kwargs.get("log_extra")
        for kind, prefix in (("rewards", METRIC_PREFIX), ("metrics", f"{METRIC_PREFIX}/metric")):
            names = sorted({name for r in results if r is not None for name in getattr(r, kind)})
            for name in names:
                values = [_value(getattr(r, kind).get(name)) if r is not None else None for r in results]
                present = [v for v in values if v is not None]
                if log_metric is not None and present:
                    log_metric(f"{prefix}/{name}", sum(present) / len(present))
                if log_extra is not None and kind == "rewards":
                    log_extra(f"{prefix}/{name}", values)
        return [None if r is None else r.reward for r in results]


def _value(entry: Any) -> float | None:
    if entry is None:
        return None
    return float(entry["score"]) if isinstance(entry, dict) else float(entry)


class _Serving:
    """``Env.serving()`` held by one task of the agents' event loop while any episode uses it: the first episode of
    a round starts the holder, the last one to finish releases it (the clients verifiers cached for the round's
    per-rollout endpoints are closed then). The holder runs in an empty context, so that a block of the loop inside
    verifiers' servers is not blamed on the agent that happened to start it."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.users = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._release: asyncio.Event | None = None

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        if self.users == 0 or loop is not self._loop:  # a new round, or a fresh agents' loop
            self._loop, self.users = loop, 0
            self._ready, self._release = loop.create_future(), asyncio.Event()
            loop.create_task(self._hold(self._ready, self._release), context=contextvars.Context())
        self.users += 1
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            await self.__aexit__()
            raise

    async def __aexit__(self, *exc: Any) -> None:
        self.users -= 1
        if self.users == 0 and self._release is not None:
            self._release.set()

    async def _hold(self, ready: asyncio.Future, release: asyncio.Event) -> None:
        try:
            async with self.env.serving():
                ready.set_result(None)
                await release.wait()
        except BaseException as exc:  # noqa: BLE001 - told to every episode waiting; the next round tries again
            if not ready.done():
                ready.set_exception(VerifiersEpisodeError(f"verifiers' Env.serving() failed: {type(exc).__name__}: "
                                                          f"{exc}"))
            else:
                logger.warning("verifiers' Env.serving() failed on exit: %s: %s", type(exc).__name__, exc)


class VerifiersEnvironment:
    """A verifiers v1 ``Env`` as a dataset, an agent and a reward function (module docstring).

    Args:
        env: The environment, as verifiers builds it (``vf.load_environment(vf.resolve_env_config(...))``, or
            :meth:`load` with its id).
        model: The model name verifiers sends (the endpoint serves any name).
        request_timeout: HTTP read timeout of verifiers' client to the endpoint, in seconds (a model call waits for
            its batch; training's ``env_timeout`` bounds an episode that stops calling the model).
        players: The player of each seat the policy does not play (module docstring): ``{"user":
            ScriptedPlayer(fn)}``, ``{"user": ModelPlayer("Qwen/Qwen2.5-7B-Instruct")}``.
        player_timeout: Seconds a seat's player may take for one reply (its episode fails after it).

    Attributes:
        seat: The seat the policy plays and trains.

    Raises:
        ValueError: ``env`` is not a verifiers ``Env``, or its seats do not leave exactly one, trainable, to the
            policy, or it runs its one seat several times per episode (:func:`_seating`), in one line.
    """

    def __init__(self, env: Any, model: str = "policy", request_timeout: float | None = None,
                 players: Mapping[str, Any] | None = None, player_timeout: float = 600.0) -> None:
        vf = _vf()
        if not isinstance(env, vf.Env):
            raise ValueError(f"VerifiersEnvironment takes a verifiers.v1 Env, got {type(env).__name__}; load one with "
                             "VerifiersEnvironment.load('<environment id>')")
        self.seat = _seating(env, dict(players or {}))
        self.seat_server = _serve_seats(env, dict(players or {}), player_timeout) if players else None
        self.env = env
        self.model = model
        self.request_timeout = request_timeout
        self._task_type = type(env.taskset).task_type()
        self._data_type = self._task_type.data_type()
        self._serving = _Serving(env)
        self.reward = VerifiersReward()

    @classmethod
    def load(cls, env_id: str, config: dict[str, Any] | None = None, **kwargs: Any) -> "VerifiersEnvironment":
        """The environment ``env_id`` (an installed environment package's id, as ``vf-eval`` / ``prime env install``
        name it: ``"my-env"`` or ``"owner/my-env"``) with ``config``: the ``[env]`` settings of a verifiers run
        (``{"agent": {"runtime": {"type": "subprocess"}}, "taskset": {"num_tasks": 100}}``), loaded by verifiers'
        own ``resolve_env_config`` and ``load_environment``. ``kwargs`` go to the constructor."""
        vf = _vf()
        config = dict(config or {})
        taskset = dict(config.pop("taskset", None) or {})
        env_config = vf.resolve_env_config({**config, "taskset": {**taskset, "id": env_id}})
        return cls(vf.load_environment(env_config), **kwargs)

    # -- the dataset -----------------------------------------------------------------------------------------
    def dataset(self, num_tasks: int | None = None) -> Any:
        """One row per task of the taskset (the first ``num_tasks``; required for an infinite taskset):
        ``prompt`` (chat messages) and ``verifiers_task`` (the task's data as JSON); a ``datasets.Dataset``."""
        from datasets import Dataset

        return Dataset.from_list(self.rows(num_tasks))

    def rows(self, num_tasks: int | None = None) -> list[dict[str, Any]]:
        """:meth:`dataset`'s rows, as a list of dicts."""
        taskset = self.env.taskset
        if num_tasks is not None:
            taskset = taskset.take(num_tasks)
        elif not taskset.bounded:
            raise ValueError(f"{type(self.env.taskset).__name__} yields tasks forever; pass num_tasks=N")
        return [{"prompt": _prompt_messages(task.data), TASK_COLUMN: task.data.model_dump_json()}
                for task in itertools.islice(taskset, num_tasks)]

    def task(self, data: str | dict[str, Any]) -> Any:
        """The task of a row (:data:`TASK_COLUMN`), rebuilt as verifiers' env server rebuilds a dispatched one."""
        data = self._data_type.model_validate_json(data) if isinstance(data, str) else \
            self._data_type.model_validate(data)
        return self._task_type(data, self.env.config.taskset.task)

    # -- the agent -------------------------------------------------------------------------------------------
    async def agent(self, endpoint: Any, verifiers_task: str, **row: Any) -> EpisodeResult:
        """One verifiers episode of the row's task, its model calls sent to ``endpoint`` (the trajectory's own base
        URL); returns its :class:`EpisodeResult`, or raises :class:`VerifiersEpisodeError`."""
        vf = _vf()
        task = self.task(verifiers_task)
        client = vf.EvalClientConfig(base_url=endpoint.base_url, api_key_var=KEY_VARIABLE,
                                     timeout={"connect": 30.0, "read": self.request_timeout})
        context = vf.ModelContext(model=self.model, client=client, sampling=vf.SamplingConfig())
        async with self._serving:
            episode = await self.env.run_episode(task, context)
        return self.result(episode)

    def result(self, episode: Any) -> EpisodeResult:
        """The :class:`EpisodeResult` of a finished episode, from the trace of the seat the policy plays; raises
        :class:`VerifiersEpisodeError` with verifiers' first error when the episode or any of its traces failed (a
        seat's player that raised or hung among them)."""
        errors = list(episode.errors) + [e for trace in episode.traces for e in trace.errors]
        if errors or not episode.ok:
            first = errors[0] if errors else None
            detail = f"{first.type}: {first.message}" if first is not None else "the episode did not conclude"
            raise VerifiersEpisodeError(f"verifiers episode failed: {detail}"[:2000])
        traces = [t for t in episode.traces if t.agent.name == self.seat]
        if len(traces) != 1:
            raise VerifiersEpisodeError(f"the verifiers episode ran seat {self.seat!r} {len(traces)} times; one run is "
                                        "trained")
        return EpisodeResult.of(traces[0])


def _seating(env: Any, players: dict[str, Any]) -> str:
    """The seat of ``env`` the policy plays (module docstring), or a one-line ``ValueError`` that says what to pass
    instead. Known from the environment's config and its ``setup()``, before any episode:

    - a seat of ``players`` that the environment does not have, or a ``FrozenCopy()`` (a verifiers agent holds no
      handle on the policy: ``ModelPlayer('<the policy's checkpoint>')`` plays the same weights, fixed);
    - not exactly one seat left to the policy (not in ``players``, no ``client`` of its own), or that seat marked
      not trainable by the environment's ``setup()``;
    - verifiers' ``best-of-n`` env with ``n > 1``: one seat run ``n`` times per episode.

    A custom ``Env`` whose ``run()`` plays the policy's seat several times is only found at its first episode, which
    then fails alone (:meth:`VerifiersEnvironment.result`)."""
    vf = _vf()
    name = type(env).__name__
    seats = [seat for seat, value in env.config if isinstance(value, vf.AgentConfig)]
    stranger = next((seat for seat in players if seat not in seats), None)
    if stranger is not None:
        raise ValueError(f"{name} has no seat {stranger!r} (seats: {', '.join(seats)}): name one of them in players=")
    from ..rollout.players import POLICY, FrozenCopy

    mine = next((seat for seat, player in players.items() if player == POLICY), None)
    if mine is not None:
        raise ValueError(f"players= names the seats other players play; the policy plays the one left out of it: drop "
                         f"{mine!r}: 'policy' from players=")
    frozen = next((seat for seat, player in players.items() if isinstance(player, FrozenCopy)), None)
    if frozen is not None:
        raise ValueError(f"FrozenCopy() copies the policy of a rollout, which a verifiers agent does not hold: play "
                         f"seat {frozen!r} with ModelPlayer('<the policy's checkpoint>') (the same weights, fixed)")
    policy = [seat for seat in seats if seat not in players and getattr(env.config, seat).client is None]
    untrained = _untrained_seats(env, seats)
    if len(policy) != 1 or policy[0] in untrained:
        others = [seat for seat in policy if seat in untrained] or policy[1:] or seats[:1]
        marked = f" ({', '.join(others)} not trained: its setup() says so)" if set(others) & untrained else ""
        raise ValueError(f"{name} plays {len(seats)} agents ({', '.join(seats)}) and the policy plays "
                         f"{len(policy)} of them{marked}; the policy trains one seat: say who plays "
                         f"{', '.join(others)}: players={{{others[0]!r}: ScriptedPlayer(fn) | ModelPlayer(...)}} "
                         "(or pin its client in the config)")
    from verifiers.v1.envs.best_of_n import BestOfNEnv

    if isinstance(env, BestOfNEnv) and env.config.n > 1:
        raise ValueError(f"{name} runs its agent {env.config.n} times per episode (best-of-n, n={env.config.n}); "
                         "each trajectory holds one agent run under its reward: drop the env id 'best-of-n' "
                         "(num_generations already samples several attempts per task) or set n=1")
    return policy[0]


def _untrained_seats(env: Any, seats: list[str]) -> set[str]:
    """The seats the environment's ``setup(agents)`` marks not trainable (``agents.user.trainable = False``), read
    by running it on stand-ins of the seats (on a thread of its own: the caller may be inside an event loop); none
    when it needs more of them than their ``trainable`` flag."""
    from types import SimpleNamespace

    stand_ins = SimpleNamespace(**{seat: SimpleNamespace(trainable=True) for seat in seats})
    done: list[bool] = []

    def read() -> None:
        try:
            asyncio.run(env.setup(stand_ins))
            done.append(True)
        except Exception:  # noqa: BLE001 - a setup that needs live agents: nothing is known before the episodes
            pass

    thread = threading.Thread(target=read, name="trl-agentic-verifiers-setup", daemon=True)
    thread.start()
    thread.join(timeout=10)
    return {seat for seat in seats if getattr(stand_ins, seat).trainable is False} if done else set()


def _serve_seats(env: Any, players: dict[str, Any], timeout: float) -> Any:
    """A :class:`~trl_agentic.integrations.seat_server.SeatServer` of ``players`` (each bound: a
    :class:`~trl_agentic.rollout.players.ModelPlayer` is loaded here), and each played seat's config given it as its
    client (its model named after the seat), so that its harness's calls reach its player."""
    from ..rollout.config import RolloutConfig
    from ..rollout.players import bind_player
    from .seat_server import SeatServer

    vf = _vf()
    config = RolloutConfig()
    server = SeatServer({seat: bind_player(player, None, None, config) for seat, player in players.items()}, timeout)
    for seat in players:
        client = vf.EvalClientConfig(base_url=server.base_url(seat), api_key_var=KEY_VARIABLE)
        setattr(env.config, seat, getattr(env.config, seat).model_copy(update={"client": client, "model": seat}))
    return server


def _prompt_messages(data: Any) -> list[dict[str, str]]:
    """A task's prompt as chat messages: its system prompt, then its user prompt (a conversation's text)."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str) or data.prompt is None:
        return messages + [{"role": "user", "content": data.prompt or ""}]
    return messages + [{"role": str(m.role), "content": _text(m.content)} for m in data.prompt]


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, Iterable):
        return "".join(getattr(part, "text", "") or "" for part in content)
    return str(content)


__all__ = ["EpisodeResult", "TASK_COLUMN", "VerifiersEnvironment", "VerifiersEpisodeError", "VerifiersReward"]
