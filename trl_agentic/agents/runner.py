"""The agent rollout: one agent run per dataset row, each talking to the policy through its own OpenAI-compatible
base URL and key, recorded as :class:`~trl_agentic.agents.session.AgentTrajectory` objects the trainers consume.

What the user writes::

    async def agent(client: openai.AsyncOpenAI, question: str, **row) -> str:
        reply = await client.chat.completions.create(model="policy", messages=[...], tools=[...])
        ...

The agent is called with a client bound to its trajectory (an ``openai.AsyncOpenAI`` for an ``async def``, an
``openai.OpenAI`` for a plain ``def``, which runs on a worker thread) and the row's columns as keyword arguments (those
it names, or all of them with ``**row``). An agent whose first parameter is named ``endpoint`` (or annotated
:class:`AgentEndpoint`) gets the base URL, key and model name instead, for agents in other processes or languages.
What it returns reaches the reward functions as ``agent_output``.

Threads: the endpoint serves on its own thread (:mod:`trl_agentic.agents.server`), the agents run on another (one event
loop, every agent a task), and generation runs on the caller's thread, the trainer's main thread
(:meth:`GenerationBridge.serve`). The server and the agents' loop live as long as the :class:`AgentRollout`.

Failures cost one trajectory: an agent that raises ends it with ``env_error`` (the exception in
``Trajectory.error``); one that neither calls the model nor returns for ``env_timeout`` seconds (time spent waiting
for the model does not count) is cancelled and ends it with ``env_timeout``; either way its key answers 409 from then
on. Python cannot stop a thread, so a plain ``def`` agent that hangs is abandoned, not stopped. An ``async def`` agent
that blocks the agents' event loop is named and fails alone; the time it held the loop is not counted against the
others (:mod:`~trl_agentic.agents.agent_loop`). An agent that reaches the policy through another trajectory's client
or key fails (:mod:`~trl_agentic.agents.ownership`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..loop_watch import BLOCK_AFTER_S, Block, owned_context
from ..rollout.config import RolloutConfig
from ..rollout.generation import Generator, generation_session
from ..rollout.observations import ObservationEncoder
from ..workers import run_in_thread
from .agent_loop import AgentLoop
from .bridge import GenerationBridge
from .forcing import CallOpenings
from .ownership import in_context, judge_round, request_hooks, running_as
from .protocol import Limits
from .server import AgentServer, Registry, new_key
from .session import AgentTrajectory, Session

logger = logging.getLogger(__name__)

CLIENT_TYPES = ("AsyncOpenAI", "OpenAI", "AgentEndpoint")
"""The annotations that mark an agent's parameter as its client (the class names, however imported)."""


@dataclass(frozen=True)
class AgentEndpoint:
    """Where an agent that brings its own client reaches the policy: ``base_url`` (``http://127.0.0.1:<port>/t/<key>
    /v1``, the trajectory's own), ``api_key`` (the trajectory's key) and ``model`` (any name is served)."""

    base_url: str
    api_key: str
    model: str


@dataclass
class Agent:
    """An agent function and the settings of its endpoint. ``agent=`` also takes the bare function (these defaults).

    Args:
        fn: ``async def fn(client, **row)`` or ``def fn(client, **row)`` (module docstring).
        batch_window: Seconds without a new model call after which the waiting calls are generated as one batch (a
            batch starts at once when every running agent is waiting; see :mod:`~trl_agentic.agents.bridge`).
        max_prompt_tokens: Longest conversation a request may start a segment with (400 ``context_length_exceeded``).
        model_name: The model name ``/v1/models`` lists (requests may name any model).
        request_timeout: The HTTP timeout of the clients handed to the agent, in seconds.
        limits: Caps on one request (body bytes, messages, tools, stop strings).
        force_tool_choice: Under ``tool_choice="required"`` or a named function, open the turn with the call (written,
            masked, never trained; :mod:`~trl_agentic.agents.forcing`); ``False`` serves them unforced.
    """

    fn: Callable[..., Any]
    batch_window: float = 0.02
    max_prompt_tokens: int = 8192
    model_name: str = "policy"
    request_timeout: float = 600.0
    limits: Limits = Limits()
    force_tool_choice: bool = True

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"agent must be a function (async def agent(client, **row)), got {type(self.fn).__name__}")
        if not self.batch_window >= 0:
            raise ValueError(f"batch_window must be >= 0 seconds, got {self.batch_window!r}")
        self._signature = self._read_signature()

    @classmethod
    def of(cls, agent: "Agent | Callable[..., Any]") -> "Agent":
        return agent if isinstance(agent, Agent) else cls(agent)

    def signature(self) -> tuple[bool, set[str] | None, list[str]]:
        """(takes an endpoint, the row columns it names or None for all, its required row parameters)."""
        return self._signature

    def _read_signature(self) -> tuple[bool, set[str] | None, list[str]]:
        params = list(inspect.signature(self.fn).parameters.values())
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if not params or params[0].kind not in positional:
            raise TypeError("the agent's first parameter receives its client: def agent(client, **row)")
        first = params[0]
        misplaced = next((p.name for p in params[1:] if _receives_client(p)), None)
        if misplaced is not None and not _receives_client(first):
            raise TypeError(f"the agent's client comes first: its parameter {misplaced!r} is not its first; write "
                            f"def agent({misplaced}, {first.name}, ...) (the row's columns follow the client)")
        endpoint = first.name == "endpoint" or first.annotation in (AgentEndpoint, "AgentEndpoint")
        named = [p for p in params[1:] if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)]
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        required = [p.name for p in named if p.default is inspect.Parameter.empty]
        return endpoint, None if takes_all else {p.name for p in named}, required

    def check_columns(self, columns: Sequence[str] | None, name: str = "train_dataset") -> None:
        """Every required parameter of the agent (after its client) is a column of the dataset."""
        if columns is None:
            return
        missing = [p for p in self.signature()[2] if p not in columns]
        if missing:
            raise ValueError(f"the agent needs {', '.join(missing)}, which no column of {name} provides (columns: "
                             f"{', '.join(columns)}); rename the column or give the parameter a default")

    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(getattr(self.fn, "__call__", None))


class AgentRollout:
    """Runs agents against the policy; see the module docstring.

    Args:
        agent: An :class:`Agent` or the bare agent function.
        processing_class: The policy's tokenizer (its chat template renders the requests).
        config: Budgets and ``env_timeout`` (the trainer's :meth:`AgenticGRPOConfig.rollout_config`); the requests
            are chat messages whatever ``rollout_mode`` says.
        eos_token_ids: Every id that ends the model's generation (the template's end-of-turn token is added).
    """

    def __init__(self, agent: Agent | Callable[..., Any], processing_class: Any, config: RolloutConfig,
                 eos_token_ids: Sequence[int]) -> None:
        self.agent = Agent.of(agent)
        self.config = config
        self.encoder = ObservationEncoder(processing_class, "chat", config.observation_role,
                                          config.chat_template_kwargs, eos_token_ids)
        self.eos_token_ids = self.encoder.turn_end_ids(eos_token_ids)
        self.openings = CallOpenings(self.encoder) if self.agent.force_tool_choice else None
        self.registry = Registry()
        self.bridge = GenerationBridge(None, self.eos_token_ids, self.agent.batch_window)
        self._server: AgentServer | None = None
        self._loop: AgentLoop | None = None
        self._round: list[Session] = []

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the endpoint and the agents' event loop (done by the first :meth:`run`)."""
        if self._server is not None:
            return
        if not self.agent.signature()[0]:
            try:
                import openai  # noqa: F401 - the clients handed to the agents
            except ImportError:
                raise ImportError("agents talk to the policy through the openai client: pip install "
                                  "'trl-agentic[agents]'") from None
        self._server = AgentServer(self.registry, self.bridge, self.agent.limits, self.agent.model_name)
        block_after = min(BLOCK_AFTER_S, self.config.env_timeout)
        self._loop = AgentLoop(block_after, self.config.env_timeout + block_after, self._stuck)
        self._shutdown = weakref.finalize(self, _shutdown, self._server, self._loop)

    def close(self) -> None:
        """Stop the endpoint and the agents' loop (also done when the rollout is garbage-collected, or at exit)."""
        if self._server is not None:
            self._shutdown()
            self._server = self._loop = None

    # -- one rollout -----------------------------------------------------------------------------------------
    def run(self, rows: Sequence[dict[str, Any]], generator: Generator,
            sync_any: Callable[[bool], bool] | None = None, multi_process: bool = False) -> list[AgentTrajectory]:
        """One agent run per row; returns their trajectories, in the rows' order. Generation happens on this thread.
        ``sync_any`` / ``multi_process``: see :class:`~trl_agentic.agents.bridge.GenerationBridge`."""
        self.start()
        sessions = [Session(new_key(), self.encoder, self.config, self.eos_token_ids, self.agent.max_prompt_tokens,
                            self.openings) for _ in rows]
        self.bridge.generator = generator
        self.bridge.sync_any = sync_any or (lambda local: local)
        self.bridge.multi_process = multi_process
        self.registry.add(sessions)
        self.bridge.start([s.key for s in sessions])
        self._round = sessions
        running = self._loop.submit(self._run_all([dict(r) for r in rows], sessions))
        try:
            with generation_session(generator):  # a request extending its conversation prefills only what is new
                self.bridge.serve()
            finished, outputs = self._loop.result(running)
        except BaseException:
            self._loop.cancel(running)
            for session in sessions:
                session.close(("env_error", "the rollout stopped"))
            raise
        finally:
            self.registry.retire(sessions)
            self._round = []
        if not finished:  # the loop was given up (a block that never ended): the agents' outputs are lost
            outputs = [None] * len(rows)
        judge_round(sessions)
        return [session.trajectory(output) for session, output in zip(sessions, outputs)]

    async def _run_all(self, rows: list[dict[str, Any]], sessions: list[Session]) -> list[Any]:
        outputs: list[Any] = [None] * len(rows)
        done = [asyncio.Event() for _ in rows]
        clients = [self._client(session) for session in sessions]  # before the agents start: not their loop time
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._run_one(row, session, client, outputs, i, done[i]),
                                  context=self._agent_context(session))
                 for i, (row, session, (client, _)) in enumerate(zip(rows, sessions, clients))]
        watchdog = asyncio.create_task(self._watch(sessions, tasks, done))
        try:
            await asyncio.gather(*(event.wait() for event in done))
        finally:
            watchdog.cancel()
            for task in tasks:
                task.cancel()
            # closed when the round ends, not when their agent does: an agent still running that reaches the
            # policy through another's client gets the endpoint's answer (ownership), not "the client has been closed"
            for _, http in clients:
                if http is not None:
                    await (http.aclose() if hasattr(http, "aclose") else asyncio.to_thread(http.close))
        return outputs

    async def _run_one(self, row: dict[str, Any], session: Session, client: Any, outputs: list[Any], i: int,
                       done: asyncio.Event) -> None:
        try:
            outputs[i] = await self._call(client, row)
            session.close()
        except asyncio.CancelledError:
            session.close(("env_timeout", "the agent was cancelled"))
        except Exception as exc:  # noqa: BLE001 - the agent's failure costs its trajectory alone
            logger.debug("agent raised %s: %s", type(exc).__name__, exc)  # named once per round by the trainer
            session.close(("env_error", f"agent raised {type(exc).__name__}: {exc}"))
        finally:
            self.bridge.finished(session.key)
            done.set()

    def _agent_context(self, session: Session) -> contextvars.Context:
        """The context an agent's task runs in (its tasks inherit it, a plain ``def`` agent's thread gets a copy):
        it acts for its trajectory (ownership), and a block of the loop it causes is reported for it."""
        context = owned_context(functools.partial(self._blocked, session))
        context.run(running_as, session.caller_id)
        return context

    def _blocked(self, session: Session, block: Block) -> None:
        """The agent of ``session`` blocks the loop (from the watchdog's thread): its trajectory fails at once."""
        if session.fail(("env_error", block.describe("the agent"))):
            logger.warning("%s", session.failure[1])
            self.bridge.finished(session.key)

    def _stuck(self, block: Block) -> None:
        """A block outlasted ``env_timeout`` plus ``block_after`` (from the watchdog's thread): the other agents of the
        round cannot run; they end, naming it, and the next round runs on a fresh loop."""
        for session in list(self._round):
            if session.close(("env_timeout", f"the agent could not run: the agents' event loop was blocked by another "
                                             f"agent for over {block.seconds:.1f} s at {block.where}")):
                self.bridge.finished(session.key)

    async def _call(self, client: Any, row: dict[str, Any]) -> Any:
        _, accepted, _ = self.agent.signature()
        kwargs = row if accepted is None else {k: v for k, v in row.items() if k in accepted}
        if self.agent.is_async():
            return await self.agent.fn(client, **kwargs)
        result = await run_in_thread(in_context(self.agent.fn), client, timeout=None, **kwargs)
        return await result if inspect.isawaitable(result) else result

    def _client(self, session: Session) -> tuple[Any, Any]:
        """What the agent receives, and the HTTP client to close after the round (``None`` for an endpoint)."""
        base_url = self._server.base_url(session.key)
        if self.agent.signature()[0]:
            return AgentEndpoint(base_url, session.key, self.agent.model_name), None
        import openai

        # plain HTTP to 127.0.0.1: no certificates to load (openai's default client loads them for every trajectory),
        # and one pool per agent (a pool shared by all agents scans every connection on each request); openai's own
        # HTTP client class (httpx, or httpx2 from openai 3 on)
        asynchronous = self.agent.is_async()
        hooks = request_hooks(self._server.base_url().removesuffix("/v1"), asynchronous)
        http = (openai.DefaultAsyncHttpxClient if asynchronous else openai.DefaultHttpxClient)(
            verify=False, trust_env=False, event_hooks=hooks)
        kind = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        client = kind(base_url=base_url, api_key=session.key, max_retries=0, timeout=self.agent.request_timeout,
                      http_client=http)
        return client, http

    async def _watch(self, sessions: list[Session], tasks: list[asyncio.Task], done: list[asyncio.Event]) -> None:
        """Cancel each agent that has been neither waiting for the model nor returning for ``env_timeout`` s, and
        each agent whose trajectory failed meanwhile (its requests went to another trajectory's key, ownership)."""
        timeout = self.config.env_timeout
        counted = self._loop.watchdog.stalled()
        while True:
            await asyncio.sleep(min(1.0, max(0.05, timeout / 10)))
            stalled = self._loop.watchdog.stalled()
            for session in sessions:  # the time the loop was blocked is not the stalled agents' time
                session.excuse(stalled - counted)
            counted = stalled
            for session, task, event in zip(sessions, tasks, done):
                if not event.is_set() and session.failure is not None:
                    task.cancel()
                elif not event.is_set() and session.idle_seconds() > timeout:
                    if session.close(("env_timeout", f"the agent neither called the model nor returned within "
                                                     f"env_timeout={timeout} s")):
                        task.cancel()
                        self.bridge.finished(session.key)
                        event.set()


def _receives_client(param: inspect.Parameter) -> bool:
    """Whether a parameter is meant for the agent's client: named ``client`` or ``endpoint``, or annotated with
    openai's client classes or :class:`AgentEndpoint`."""
    annotation = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
    return param.name in ("client", "endpoint") or annotation.rpartition(".")[2] in CLIENT_TYPES


def _shutdown(server: AgentServer, loop: AgentLoop) -> None:
    """Stop the endpoint and the agents' loop."""
    server.stop()
    loop.stop()
