"""OpenEnv's MCP tool environments (an ``MCPEnvironment`` whose tools are FastMCP tools: listed, then called) trained
with their own tools, as the model's native tool calls:

    servers = OpenEnvServers("adder_env.server.app:app", num_servers=2, environments=environments_per_round(args))
    trainer = AgenticGRPOTrainer(..., environment=openenv_mcp_environment(servers, client=AdderEnv),
                                 reward_funcs=TurnReward("sum"))

- **One session per trajectory**, on the environment's own server (:class:`~trl_agentic.integrations.openenv.
  OpenEnvServers`: its app under uvicorn on 127.0.0.1), through its own client (an ``MCPToolClient`` subclass, as
  OpenEnv's ``echo_env`` ships one; ``MCPToolClient`` itself by default), opened at ``reset`` on the server
  :meth:`~trl_agentic.integrations.openenv.OpenEnvServers.url` hands out and closed at ``close``. ``reset`` resets
  the episode with the row's ``seed`` (the columns named by ``reset_fields``); ``reset_text`` may turn the reset's
  observation into text appended to the prompt (the question an environment draws).
- **Its tools are the model's tools.** After the reset the client lists the session's tools (MCP ``tools/list``,
  OpenEnv's ``POST /mcp``); each becomes a native tool whose schema is the listing's (name, description, input
  schema: :class:`MCPTool`), rendered by the chat template as any tool's, so the model is shown exactly what the
  server lists, and the parser types each call's arguments by it.
- **Each call goes to the session**, in call order: OpenEnv's ``CallToolAction`` stepped on the client's session, which
  the server's ``MCPEnvironment`` runs as MCP ``tools/call`` on its FastMCP server. The step loop, not the bare
  ``tools/call`` of ``POST /mcp`` (which bypasses ``step``), is the path OpenEnv documents for training
  (``docs/source/mcp-environment-lifecycle.md``): only it carries the environment's ``reward`` and ``done``. The
  result's text content comes back as the call's ``tool`` message; an error the environment reports for a call
  (the tool raised, its arguments did not validate) is answered as TRL answers a tool that raised,
  ``{'error': '...'}``, and the trajectory goes on.
- **Rewards and states, per turn**: the rewards of the turn's calls, summed, are the turn's reward
  (``TurnReward("sum")`` gives the episode's; PPO's turn-level GAE and GiGPO read them, ``docs/credit.md``); the key
  of the last call's observation, its fields but ``reward``, is the turn's ``info["state_key"]``
  (:func:`~trl_agentic.integrations.openenv_environment.observation_key`); a call whose observation is ``done`` ends
  the episode after its turn (``terminated``).
- **A failure costs its own trajectory**, named in one line (``env_error``): a reset that raises (a server at
  capacity, gone, or whose environment fails), a session that lists no tool, a call that the server does not answer
  within ``tool_timeout`` seconds (the session is given up: the server may still be running it), or a call whose
  connection fails (the server died: its other trajectories fail on their next call; the next ``url()`` restarts
  it). The others play on.

OpenEnv is imported only when a session opens (the client's package imports it).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any, Awaitable, Callable, Sequence

from ..environments.base import StepResult
from ..environments.native_tools import ToolCallEnvironment
from .openenv_environment import observation_key

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0
"""Seconds the session :func:`openenv_mcp_environment` opens may take to reset, list its tools and close."""


class MCPSessionError(RuntimeError):
    """A trajectory's MCP session failed (reset, listing, a call unanswered or cut off): the trajectory ends."""


class MCPToolError(RuntimeError):
    """The environment reported an error for one call: the model reads it as the call's result."""


class MCPTool:
    """One tool of an MCP listing as a native tool: :attr:`json_schema` is what the chat template shows the model
    (the listing's name, description and input schema), and calling it sends the call to the trajectory's session.

    Args:
        name, description, input_schema: The listing's entry (OpenEnv's ``Tool``).
        call: ``call(name, arguments)``, the session's call, returning the result's text.
    """

    def __init__(self, name: str, description: str, input_schema: dict[str, Any],
                 call: Callable[[str, dict[str, Any]], Awaitable[str]]) -> None:
        self.__name__ = name
        self.json_schema = {"type": "function", "function": {
            "name": name, "description": description or "",
            "parameters": input_schema or {"type": "object", "properties": {}}}}
        self._call = call

    async def __call__(self, /, **arguments: Any) -> str:
        return await self._call(self.__name__, arguments)

    def __repr__(self) -> str:
        return f"MCPTool({self.__name__!r})"


class OpenEnvMCPEnvironment(ToolCallEnvironment):
    """One trajectory on an OpenEnv MCP tool environment (module docstring): a session of its own, the session's
    listed tools as the model's native tools.

    Args:
        servers: The environment's servers (:class:`~trl_agentic.integrations.openenv.OpenEnvServers`).
        client: The environment's client class (an ``MCPToolClient`` subclass); ``None``: ``MCPToolClient``.
        reset_fields: The row's columns passed to the episode's reset (those the row has).
        reset_text: ``reset_text(observation)``: the text appended to the prompt from the reset's observation
            (``None``: nothing).
        tool_timeout: Seconds a call may go unanswered before the trajectory ends.
        answer_malformed_calls, check_argument_types: As :class:`~trl_agentic.environments.native_tools.
            ToolCallEnvironment`'s (``check_argument_types`` checks against the listed schema).
    """

    def __init__(self, servers: Any, client: type | None = None, reset_fields: Sequence[str] = ("seed",),
                 reset_text: Callable[[Any], str | None] | None = None, tool_timeout: float = 30.0,
                 answer_malformed_calls: bool = False, check_argument_types: bool = False) -> None:
        super().__init__((), tool_timeout=None, answer_malformed_calls=answer_malformed_calls,  # timed in _send
                         check_argument_types=check_argument_types)
        self.call_timeout = tool_timeout
        self.servers, self.client_class = servers, client
        self.reset_fields, self.reset_text = tuple(reset_fields), reset_text
        self.client: Any = None
        self.url: str | None = None
        self._lost: str | None = None  # why the session was given up
        self._lock = asyncio.Lock()  # one call at a time on the session
        self._reward = 0.0
        self._last: Any = None  # the last call's StepResult

    async def reset(self, **row: Any) -> str | None:
        """Open a session, reset its episode with the row's ``reset_fields`` and list its tools; the reset's text."""
        self.url = await asyncio.to_thread(self.servers.url)  # may wait for a health check: off the loop
        self.client = _client_class(self.client_class)(base_url=self.url)
        try:
            reset = await self.client.reset(**{name: row[name] for name in self.reset_fields if name in row})
            listed = await self.client.list_tools(use_cache=False)
        except Exception as exc:
            raise MCPSessionError(f"the OpenEnv server at {self.url} did not reset a session: {_one_line(exc)}") \
                from None
        if not listed:  # OpenEnv's client answers [] when the listing itself failed
            raise MCPSessionError(f"the OpenEnv server at {self.url} lists no MCP tools: its app must serve an "
                                  "MCPEnvironment (create_app(..., CallToolAction, CallToolObservation))")
        self.tools = [MCPTool(tool.name, tool.description, tool.input_schema, self._send) for tool in listed]
        self.sequential = list(self.tools)
        return None if self.reset_text is None else self.reset_text(reset.observation)

    async def step(self, message: dict[str, Any]) -> StepResult:
        """The turn's calls (:class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`), their rewards
        summed, the last observation's key, ``terminated`` when an observation is ``done``; a lost session raises."""
        self._reward, self._last = 0.0, None
        result = await super().step(message)
        if self._lost is not None:
            raise MCPSessionError(self._lost)
        result.reward = self._reward
        if self._last is not None:
            key = observation_key(self._last.observation)
            if key is not None:
                result.info["state_key"] = key
            result.terminated = result.terminated or bool(self._last.done)
        return result

    async def _send(self, name: str, arguments: dict[str, Any]) -> str:
        """One call on the session (module docstring): the result's text; :class:`MCPToolError` for an error the
        environment reports; a call unanswered or cut off gives the session up."""
        from openenv.core.env_server.mcp_types import CallToolAction

        async with self._lock:
            if self._lost is not None:
                raise MCPSessionError(self._lost)
            try:
                result = await asyncio.wait_for(self.client.step(CallToolAction(tool_name=name, arguments=arguments)),
                                                self.call_timeout)
            except asyncio.TimeoutError:
                self._lost = (f"the MCP tool {name} on the OpenEnv server at {self.url} did not answer within "
                              f"{self.call_timeout:g} s")
                raise MCPSessionError(self._lost) from None
            except Exception as exc:
                self._lost = f"the MCP tool call {name} on the OpenEnv server at {self.url} failed: {_one_line(exc)}"
                raise MCPSessionError(self._lost) from None
        self._reward += float(result.reward or 0.0)
        self._last = result
        error = getattr(result.observation, "error", None)
        if error is not None:
            raise MCPToolError(str(getattr(error, "message", error)))
        return result_text(getattr(result.observation, "result", None))

    async def close(self) -> None:
        """Close the client: its WebSocket, then the server's session (OpenEnv's client closes the session best
        effort: a server that is gone has dropped it already)."""
        client, self.client = self.client, None
        if client is not None:
            await client.close()


def result_text(result: Any) -> str:
    """The text of an MCP call's result (``CallToolResult`` as JSON, as the session's observation carries it): the
    text of its content parts, one after another (a part that is not text as its JSON), as MCP clients show a model; a result that is not MCP's ``CallToolResult`` (an environment's own
    value) as its text. :class:`MCPToolError` for a result marked ``isError``."""
    fields = result.model_dump() if callable(getattr(result, "model_dump", None)) else result
    if not isinstance(fields, dict) or not isinstance(fields.get("content"), list):
        return result if isinstance(result, str) else json.dumps(result) if isinstance(result, (dict, list)) \
            else str(result)
    parts = [part.get("text", "") if part.get("type") == "text" else json.dumps(part, sort_keys=True)
             for part in fields["content"] if isinstance(part, dict)]
    text = "\n".join(parts)
    if fields.get("is_error") or fields.get("isError"):
        raise MCPToolError(text)
    return text


def _client_class(client: type | None) -> type:
    if client is not None:
        return client
    from openenv.core.mcp_client import MCPToolClient

    return MCPToolClient


def _one_line(exc: BaseException) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def openenv_mcp_environment(servers: Any, client: type | None = None, reset_fields: Sequence[str] = ("seed",),
                            reset_text: Callable[[Any], str | None] | None = None, tool_timeout: float = 30.0,
                            answer_malformed_calls: bool = False,
                            check_argument_types: bool = False) -> Callable[[], OpenEnvMCPEnvironment]:
    """``environment=`` for an OpenEnv MCP tool environment: a factory of :class:`OpenEnvMCPEnvironment` (its
    arguments). The servers are started here if they have not been, and one session is opened and its tools listed
    (as the engine opens one, reset with no row), so that an app that serves no MCP tools is refused before
    training, in one line.

    Raises:
        ValueError: The first session did not reset, or listed no tools, in one line.
    """
    from ..rollout.env_calls import EnvFailure, call_all

    factory = functools.partial(OpenEnvMCPEnvironment, servers, client, reset_fields, reset_text, tool_timeout,
                                answer_malformed_calls, check_argument_types)
    servers.start()
    probe = factory()
    reset = call_all([probe], "reset", [{}], PROBE_TIMEOUT_S)[0]
    call_all([probe], "close", [None], PROBE_TIMEOUT_S)
    if isinstance(reset, EnvFailure):
        raise ValueError(f"{reset.detail}; nothing trains on it")
    logger.info("OpenEnv MCP tools: %s", ", ".join(tool.__name__ for tool in probe.tools))
    return factory


__all__ = ["MCPTool", "OpenEnvMCPEnvironment", "openenv_mcp_environment", "result_text"]
