"""Which agent sent a request, and trajectories that mixed.

Agents of one round run concurrently in one process, so an agent can reach the policy through a client that is not
its own: a process-wide client (the OpenAI Agents SDK's documented setup for other providers,
``set_default_openai_client(client)``, is shared by every agent running), a client or endpoint kept in a module-level
variable by an earlier run. Its requests then land in another trajectory's record and train under that trajectory's
reward. Two checks keep records apart:

- **Proof of the sender** (exact). The runner marks each agent's task with its trajectory (:func:`running_as`; the
  tasks it starts inherit it, and a plain ``def`` agent's thread), and every client it hands to an agent stamps each request to the
  endpoint with the trajectory running where the request is sent (:data:`CALLER_HEADER`, a per-trajectory id that is
  not its key). A request whose sender is not the trajectory its key names is refused, and the sender's trajectory
  fails with :data:`MIXED`; the trajectory whose key it reached keeps its clean record.
- **The records at the end of the round** (for clients the agent built itself, which carry no proof):
  :func:`judge_round` fails an agent that returned without a model call of its own together with every trajectory
  whose key received several conversations without proof of their sender.
"""

from __future__ import annotations

import contextvars
import secrets
from typing import Any, Callable, Sequence

CALLER_HEADER = "x-trl-agentic-caller"
"""The header that names the trajectory whose agent sent a request (its ``caller_id``)."""

FIX = ("give each agent its own: pass the client the agent receives to its framework (e.g. OpenAIChatCompletionsModel"
       "(model=..., openai_client=client)), or build one inside the agent from endpoint.base_url and endpoint.api_key")
MIXED = ("trajectories mixed: the agent sent a request through another trajectory's client or key (a process-wide "
         "client such as the Agents SDK's set_default_openai_client, or a client kept from another run); " + FIX)
SILENT = ("trajectories mixed: the agent returned without a model call of its own while another trajectory's key "
          "received {n} conversations: its requests likely went through that trajectory's base URL or key (a "
          "process-wide client such as the Agents SDK's set_default_openai_client, or an endpoint kept from another "
          "run); " + FIX)
CROWDED = ("trajectories mixed: this trajectory's key received {n} conversations while another agent returned without "
           "a model call of its own: they likely came through this trajectory's base URL or key (a process-wide "
           "client such as the Agents SDK's set_default_openai_client, or an endpoint kept from another run); " + FIX)

_running: contextvars.ContextVar[str | None] = contextvars.ContextVar("trl_agentic_caller", default=None)


def new_caller_id() -> str:
    """A trajectory's sender id: random, and not its key (a leaked header gives no access to the record)."""
    return secrets.token_hex(16)


def running_as(caller_id: str) -> None:
    """Mark the current task (and what it starts from now on) as the agent of the trajectory ``caller_id``."""
    _running.set(caller_id)


def in_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` to run on another thread with the current task's marks (a plain ``def`` agent's worker thread)."""
    context = contextvars.copy_context()

    def run(*args: Any, **kwargs: Any) -> Any:
        return context.run(fn, *args, **kwargs)

    return run


def request_hooks(origin: str, asynchronous: bool) -> dict[str, list[Callable[..., Any]]]:
    """``event_hooks`` for the httpx client of an agent's OpenAI client: each request to ``origin``
    (``http://127.0.0.1:<port>``, the endpoint; no other host ever sees the header) carries the sender's id."""
    def stamp(request: Any) -> None:
        if str(request.url).startswith(origin + "/"):
            caller = _running.get()
            if caller is None:
                request.headers.pop(CALLER_HEADER, None)
            else:
                request.headers[CALLER_HEADER] = caller

    async def stamp_async(request: Any) -> None:
        stamp(request)

    return {"request": [stamp_async if asynchronous else stamp]}


def judge_round(sessions: Sequence[Any]) -> None:
    """Fail the trajectories (:class:`~trl_agentic.agents.session.Session` objects) of a round that mixed without
    proof of their senders (module docstring): every agent that returned without a model call, and every trajectory
    whose key received several conversations not all proven its own, when both kinds are in the round. Records that
    were proven clean are left alone."""
    silent = [s for s in sessions if s.failure is None and s.requests == 0]
    crowded = [s for s in sessions if s.failure is None and len(s.segments) > 1 and s.unproven_requests]
    if not silent or not crowded:
        return
    n = max(len(s.segments) for s in crowded)
    for session in silent:
        session.fail(("env_error", SILENT.format(n=n)))
    for session in crowded:
        session.fail(("env_error", CROWDED.format(n=len(session.segments))))
