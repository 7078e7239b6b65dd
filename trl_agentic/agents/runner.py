"""The agent rollout: one agent run per dataset row, each talking to the policy through its own OpenAI-compatible
base URL and key, recorded as :class:`~trl_agentic.agents.session.AgentTrajectory` objects the trainers consume.

What the user writes::

    async def agent(client: openai.AsyncOpenAI, question: str, **row) -> str:
        reply = await client.chat.completions.create(model="policy", messages=[...], tools=[...])
        ...

The agent is called with a client bound to its trajectory (an ``openai.AsyncOpenAI`` for an ``async def``, an
``openai.OpenAI`` for a plain ``def``) and the row's columns as keyword arguments (those it names, or all of them with
``**row``). An agent whose first parameter is named ``endpoint`` (or annotated :class:`AgentEndpoint`) gets the base
URL, key and model name instead, for agents in other processes or languages. What it returns reaches the reward
functions as ``agent_output``.

Threads: the endpoint serves on its own thread (:mod:`trl_agentic.agents.server`), the agents run on another (one event
loop, every agent a task, so that agents may share what is bound to a loop), and generation runs on the caller's
thread, the trainer's main thread (:meth:`GenerationBridge.serve`). The server and the agents' loop live as long as the
:class:`AgentRollout`.

Failures cost one trajectory: an agent that raises ends it with ``env_error`` (the exception in
``Trajectory.error``); one that neither calls the model nor returns for ``env_timeout`` seconds (time spent waiting
for the model does not count) is cancelled and ends it with ``env_timeout``; either way its key answers 409 from then
on. An agent that returns though the model never answered it, the endpoint having refused its requests, ends with
``env_error`` naming the refusal (it never attempted its task). Python cannot stop a thread, so a plain ``def`` agent
that hangs is abandoned, not stopped. An ``async def`` agent that blocks the agents' event loop is named and fails
alone (:mod:`~trl_agentic.agents.agent_loop`): the time it held the loop is not counted against the others, and a
block past ``env_timeout`` gives the loop up and starts the others again, each from its start with a fresh
trajectory, on a fresh loop. An agent that reaches the policy through another trajectory's client fails, and a
request that cannot be proven to come from its key's agent never starts a segment in that key's record
(:mod:`~trl_agentic.agents.ownership`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..loop_watch import BLOCK_AFTER_S, Block, owned_context
from ..rollout.config import RolloutConfig
from ..rollout.generation import Generator, generation_session
from ..rollout.observations import ObservationEncoder
from ..workers import run_in_thread
from .agent_loop import AgentLoop
from .bridge import GenerationBridge
from .context import ContextLimit, context_limit
from .forcing import CallOpenings
from .ownership import CALLER_HEADER, in_context, request_hooks, running_as
from .protocol import Limits
from .server import AgentServer, Registry, new_key
from .session import AgentTrajectory, Session
from .turn_rewards import TurnRewards, score_turns

logger = logging.getLogger(__name__)

CLOSE_S = 10.0
"""How long the round's end waits for its HTTP clients to close."""
CLIENT_TYPES = ("AsyncOpenAI", "OpenAI", "AgentEndpoint")
"""The annotations that mark an agent's parameter as its client (the class names, however imported)."""


@dataclass(frozen=True)
class AgentEndpoint:
    """Where an agent that brings its own client reaches the policy: ``base_url`` (``http://127.0.0.1:<port>/t/<key>
    /v1``, the trajectory's own), ``api_key`` (the trajectory's key) and ``model`` (any name is served).

    A client built from these alone carries no proof of which agent sends its requests: the trajectory then keeps to
    the first conversation its key receives (:mod:`~trl_agentic.agents.ownership`). Give it :meth:`http_client` to
    send several (sub-agents, a rewritten history), or, for a client in another process (a CLI agent), ``headers``:
    sent with each request, they prove that this trajectory's agent sent it (Codex CLI's provider ``http_headers``,
    Claude Code's ``ANTHROPIC_CUSTOM_HEADERS``)."""

    base_url: str
    api_key: str
    model: str
    _http: Callable[[bool], Any] | None = field(default=None, repr=False, compare=False)
    _replies: Callable[[], int] | None = field(default=None, repr=False, compare=False)
    headers: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def http_client(self, asynchronous: bool = True) -> Any:
        """An HTTP client (openai's ``DefaultAsyncHttpxClient``, or ``DefaultHttpxClient`` with ``asynchronous=False``)
        whose requests to the endpoint carry proof that this trajectory's agent sent them, for the clients a framework
        builds: ``openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key,
        http_client=endpoint.http_client())``, ``anthropic.AsyncAnthropic(..., http_client=...)``, langchain's
        ``ChatOpenAI(..., http_async_client=...)``. Closed when the round ends."""
        if self._http is None:
            raise RuntimeError("this endpoint was not handed to an agent by a rollout: it has no HTTP client")
        return self._http(asynchronous)

    def model_replies(self) -> int:
        """How many of this trajectory's requests the model has answered so far (a request refused or answered over
        budget is not one): an agent in another process learns whether it ever reached the policy."""
        if self._replies is None:
            raise RuntimeError("this endpoint was not handed to an agent by a rollout: it has no trajectory")
        return self._replies()


@dataclass
class Agent:
    """An agent function and the settings of its endpoint. ``agent=`` also takes the bare function (these defaults).

    Args:
        fn: ``async def fn(client, **row)`` or ``def fn(client, **row)`` (module docstring).
        batch_window: Seconds without a new model call after which the waiting calls are generated as one batch (a
            batch starts at once when every running agent is waiting; see :mod:`~trl_agentic.agents.bridge`).
        max_prompt_tokens: Longest conversation a request may start a segment with (400 ``context_length_exceeded``);
            ``None``: the model's limit alone (every request must leave the model a position to generate in,
            :mod:`~trl_agentic.agents.context`).
        model_name: The model name ``/v1/models`` lists (requests may name any model).
        request_timeout: The HTTP timeout of the clients handed to the agent, in seconds.
        limits: Caps on one request (body bytes, messages, tools, stop strings).
        force_tool_choice: Under ``tool_choice="required"`` or a named function, open the turn with the call (written,
            masked, never trained; :mod:`~trl_agentic.agents.forcing`); ``False`` serves them unforced.
        turn_rewards: A reward for each model call of a run, from its recorded turns:
            ``turn_rewards(trajectory, **row)``, called after the agent returned, once per segment (``trajectory``: the
            segment, with its ``actions``, ``observations`` and ``messages``; ``row``: the row's columns and
            ``agent_output``), returns one finite number per turn of the segment, kept as its ``turn_rewards`` (PPO's
            turn-level GAE and GiGPO read them). It runs on the trainer's thread after the round's agents ended; a
            call that raises or returns anything else costs its run alone (``env_error``).
            :mod:`~trl_agentic.agents.turn_rewards`. ``None``: every turn's reward is 0.
        train_auxiliary: Train the auxiliary calls a CLI makes beside its task (a title, a summary, a quota check:
            :mod:`~trl_agentic.agents.auxiliary`), each as a training row of its own; ``False`` (the default) answers
            and counts them, and keeps them out of training (``AgentTrajectory.auxiliary``).
    """

    fn: Callable[..., Any]
    batch_window: float = 0.02
    max_prompt_tokens: int | None = None
    model_name: str = "policy"
    request_timeout: float = 600.0
    limits: Limits = Limits()
    force_tool_choice: bool = True
    turn_rewards: TurnRewards | None = None
    train_auxiliary: bool = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"agent must be a function (async def agent(client, **row)), got {type(self.fn).__name__}")
        if self.turn_rewards is not None and not callable(self.turn_rewards):
            raise TypeError("turn_rewards must be a function turn_rewards(trajectory, **row) -> one number per turn, "
                            f"got {type(self.turn_rewards).__name__}")
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


@dataclass
class AgentRun:
    """One row's agent run in a round: its trajectory's session (a fresh one if the run was started again), what the
    agent returned, and whether it has ended."""

    row: dict[str, Any]
    session: Session
    output: Any = None
    ended: threading.Event = field(default_factory=threading.Event)
    future: concurrent.futures.Future | None = None


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
        self._runs: list[AgentRun] = []
        self._sessions: list[Session] = []  # every session of the round, those of runs started again included
        self._clients: list[tuple[asyncio.AbstractEventLoop | None, Any]] = []  # the round's HTTP clients, by loop
        self._context: ContextLimit | None = None
        self._blamed: Session | None = None  # the agent the last block was blamed on
        self._lock = threading.Lock()

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
        self._context = context_limit(generator)
        self.bridge.generator = generator
        self.bridge.sync_any = sync_any or (lambda local: local)
        self.bridge.multi_process = multi_process
        runs = [AgentRun(dict(row), self._session()) for row in rows]
        with self._lock:
            self._runs, self._sessions, self._clients = runs, [r.session for r in runs], []
        self.registry.add(self._sessions)
        self.bridge.start([r.session.key for r in runs])
        over = threading.Event()
        for run in runs:
            self._submit(run)
        threading.Thread(target=self._watch, args=(runs, over), name="trl-agentic-agent-watch", daemon=True).start()
        try:
            with generation_session(generator):  # a request extending its conversation prefills only what is new
                self.bridge.serve()
            for run in runs:
                run.ended.wait()
        except BaseException:
            for run in runs:
                run.session.close(("env_error", "the rollout stopped"))
                if run.future is not None:
                    run.future.cancel()
            raise
        finally:
            over.set()
            with self._lock:
                sessions, clients, self._runs = self._sessions, self._clients, []
            self.registry.retire(sessions)
            self._close_clients(clients)
        trajectories = [run.session.trajectory(run.output) for run in runs]
        if self.agent.turn_rewards is not None:
            for run, trajectory in zip(runs, trajectories):
                score_turns(trajectory, self.agent.turn_rewards, run.row)
        return trajectories

    def _session(self) -> Session:
        handed = not self.agent.signature()[0]  # the client it is handed proves its requests' sender
        return Session(new_key(), self.encoder, self.config, self.eos_token_ids, self.agent.max_prompt_tokens,
                       self.openings, self._context, proves_sender=handed, train_auxiliary=self.agent.train_auxiliary)

    def _submit(self, run: AgentRun) -> None:
        """Start ``run``'s agent on the agents' loop, in its own context (:meth:`_agent_context`)."""
        session = run.session
        run.future = self._loop.submit(self._run_one(run, session), self._agent_context(session))

    async def _run_one(self, run: AgentRun, session: Session) -> None:
        """One agent run with ``session``'s client. Once the run was started again with another session, this one's
        late outcome is dropped."""
        client = self._client(session)
        try:
            output = await self._call(client, run.row)
            refused = _refused_only(session)
            failure = None if refused is None else ("env_error", f"the agent got no model reply: {refused}")
            if session.close(failure) and run.session is session:
                run.output = output
        except asyncio.CancelledError:
            session.close(("env_timeout", "the agent was cancelled"))
        except Exception as exc:  # noqa: BLE001 - the agent's failure costs its trajectory alone
            logger.debug("agent raised %s: %s", type(exc).__name__, exc)  # named once per round by the trainer
            refused = _refused_only(session)
            error = f"agent raised {type(exc).__name__}: {exc}" + (f"; {refused}" if refused else "")
            session.close(("env_error", error))
        finally:
            self.bridge.finished(session.key)
            if run.session is session:
                run.ended.set()

    async def _call(self, client: Any, row: dict[str, Any]) -> Any:
        _, accepted, _ = self.agent.signature()
        kwargs = row if accepted is None else {k: v for k, v in row.items() if k in accepted}
        if self.agent.is_async():
            return await self.agent.fn(client, **kwargs)
        result = await run_in_thread(in_context(self.agent.fn), client, timeout=None, **kwargs)
        return await result if inspect.isawaitable(result) else result

    def _agent_context(self, session: Session) -> contextvars.Context:
        """The context an agent's task runs in (its tasks inherit it, a plain ``def`` agent's thread gets a copy):
        it acts for its trajectory (ownership), and a block of the loop it causes is reported for it."""
        context = owned_context(functools.partial(self._blocked, session))
        context.run(running_as, session.caller_id)
        return context

    def _blocked(self, session: Session, block: Block) -> None:
        """The agent of ``session`` blocks the loop (from the watchdog's thread): its trajectory fails at once."""
        with self._lock:
            self._blamed = session
        if session.fail(("env_error", block.describe("the agent"))):
            logger.warning("%s", session.failure[1])
            self.bridge.finished(session.key)

    def _stuck(self, block: Block) -> None:
        """A block outlasted ``env_timeout`` plus ``block_after`` (from the watchdog's thread): the loop is given up.
        The agent that blocks has failed already (:meth:`_blocked`); every other agent of the round still running
        starts again from the start on a fresh loop, with a fresh trajectory (its first one's requests answer 409 from
        then on). A block no agent was blamed for (a first import inside ``async def`` that never ends) ends them
        instead, naming it: starting them again could meet it again."""
        with self._lock:
            runs, culprit, self._blamed = list(self._runs), self._blamed, None
        blamed = any(run.session is culprit for run in runs)
        for run in runs:
            if run.ended.is_set():
                continue
            session = run.session
            if session.failure is None and blamed:
                self._restart(run, block)
                continue
            session.close(("env_timeout", f"the agent could not run: the agents' event loop was blocked by another "
                                          f"agent for over {block.seconds:.1f} s at {block.where}"))
            self.bridge.finished(session.key)
            run.ended.set()

    def _restart(self, run: AgentRun, block: Block) -> None:
        """Start ``run`` again on the fresh loop, with a fresh session; the old one is closed, its record dropped."""
        old, new = run.session, self._session()
        new.events["restarted"] = old.events["restarted"] + 1
        self.registry.add([new])
        with self._lock:
            self._sessions.append(new)
        self.bridge.add(new.key)  # before the old key ends: the round never looks finished meanwhile
        run.session = new
        old.close(("env_timeout", f"started again: the agents' event loop was blocked for over {block.seconds:.1f} s "
                                  f"at {block.where}"))
        self.bridge.finished(old.key)
        logger.warning("the agents' event loop was blocked for over %.1f s at %s: the round's other agents start again "
                       "on a fresh loop", block.seconds, block.where)
        self._submit(run)

    def _client(self, session: Session) -> Any:
        """What the agent receives: an OpenAI client over :meth:`_http_client`, or an :class:`AgentEndpoint`."""
        base_url = self._server.base_url(session.key)
        if self.agent.signature()[0]:
            return AgentEndpoint(base_url, session.key, self.agent.model_name,
                                 functools.partial(self._http_client, session), lambda: session.turns,
                                 headers={CALLER_HEADER: session.caller_id})
        import openai

        asynchronous = self.agent.is_async()
        kind = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        return kind(base_url=base_url, api_key=session.key, max_retries=0, timeout=self.agent.request_timeout,
                    http_client=self._http_client(session, asynchronous))

    def _http_client(self, session: Session, asynchronous: bool) -> Any:
        """An HTTP client whose requests carry proof that ``session``'s agent sent them (ownership), closed when the
        round ends. Plain HTTP to 127.0.0.1: no certificates to load (openai's default client loads them for every
        trajectory), and one pool per agent (a pool shared by all agents scans every connection on each request);
        openai's own HTTP client class (httpx, or httpx2 from openai 3 on)."""
        import openai

        hooks = request_hooks(self._server.base_url().removesuffix("/v1"), session.caller_id, self.registry.blame,
                              asynchronous)
        http = (openai.DefaultAsyncHttpxClient if asynchronous else openai.DefaultHttpxClient)(
            verify=False, trust_env=False, event_hooks=hooks)
        with self._lock:
            self._clients.append((self._loop.loop if asynchronous else None, http))
        return http

    def _close_clients(self, clients: list[tuple[asyncio.AbstractEventLoop | None, Any]]) -> None:
        """Close the round's HTTP clients: sync ones here, async ones on the loop they ran on (those of a given-up
        loop are left to it). They close when the round ends, not when their agent does: an agent still running that
        reaches the policy through another's client gets the endpoint's answer (ownership), not "the client has been
        closed"."""
        loop = self._loop.loop
        for owner, http in clients:
            if owner is None:
                http.close()
        live = [http for owner, http in clients if owner is loop]
        if live:
            closing = asyncio.run_coroutine_threadsafe(_close_all(live), loop)
            concurrent.futures.wait([closing], timeout=CLOSE_S)

    def _watch(self, runs: list[AgentRun], over: threading.Event) -> None:
        """Until the round is over (on a thread of its own, so that a blocked loop does not stop it): cancel each
        agent whose trajectory failed meanwhile (it used another trajectory's client, ownership), and each agent that
        has been neither waiting for the model nor returning for ``env_timeout`` s. The time the loop was blocked is
        not counted against the agents it stalled."""
        timeout = self.config.env_timeout
        tick = min(1.0, max(0.05, timeout / 10))
        watchdog = self._loop.watchdog
        counted = watchdog.stalled()
        while not over.wait(tick):
            if self._loop.watchdog is not watchdog:  # a fresh loop: its own count
                watchdog, counted = self._loop.watchdog, 0.0
            if not _answers(watchdog.loop, tick):  # blocked: the watchdog's business, no agent's time meanwhile
                continue
            stalled = watchdog.stalled()
            for run in runs:
                run.session.excuse(stalled - counted)
            counted = stalled
            for run in runs:
                session, future = run.session, run.future
                if run.ended.is_set():
                    continue
                if session.failure is not None:
                    future.cancel()
                elif session.idle_seconds() > timeout and session.close((
                        "env_timeout", f"the agent neither called the model nor returned within env_timeout={timeout} s")):
                    future.cancel()
                    self.bridge.finished(session.key)
                    run.ended.set()


def _refused_only(session: Session) -> str | None:
    """For a run the model never answered though the endpoint refused its requests (a CLI whose every request is
    refused exits with an error; an agent may catch the error and return): the refusal, in one line; else ``None``.
    Such a run did not attempt its task, so it fails rather than end ``terminated`` with zero turns. Answered
    auxiliary calls (a title, a quota check) do not count: a CLI whose task requests were all refused failed too."""
    task_turns = sum(len(s.trajectory.turn_spans) for s in session.segments if s.auxiliary is None)
    if task_turns or not session.refusal:
        return None
    return "the endpoint refused its request: " + " ".join(session.refusal.split())


def _answers(loop: asyncio.AbstractEventLoop, seconds: float) -> bool:
    """Whether ``loop`` runs a callback within ``seconds`` (it is not blocked); once it has, the time it was blocked
    is counted (:meth:`~trl_agentic.loop_watch.LoopWatchdog.stalled`: the watchdog's own callback was queued first)."""
    answered = threading.Event()
    try:
        loop.call_soon_threadsafe(answered.set)
    except RuntimeError:  # closed
        return False
    return answered.wait(seconds)


async def _close_all(clients: list[Any]) -> None:
    for http in clients:
        await http.aclose()


def _shutdown(server: AgentServer, loop: AgentLoop) -> None:
    """Stop the endpoint and the agents' loop."""
    server.stop()
    loop.stop()


def _receives_client(param: inspect.Parameter) -> bool:
    """Whether a parameter is meant for the agent's client: named ``client`` or ``endpoint``, or annotated with
    openai's client classes or :class:`AgentEndpoint`."""
    annotation = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
    return param.name in ("client", "endpoint") or annotation.rpartition(".")[2] in CLIENT_TYPES


