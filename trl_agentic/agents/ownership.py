"""Which agent sent a request: a key is bound to its trajectory's conversation.

Agents of one round run concurrently in one process, so an agent can reach the policy through a client or key that is
not its own: a process-wide client (the OpenAI Agents SDK's documented setup for other providers,
``set_default_openai_client(client)``, is shared by every agent running), a client or endpoint kept in a module-level
variable by an earlier run, a key read from a shared object and sent with a plain HTTP client. Its requests would then
land in another trajectory's record and train under that trajectory's reward. Two rules keep records apart:

- **Proof of the sender.** The runner marks each agent's task with its trajectory (:func:`running_as`; the tasks it
  starts inherit the mark, and a plain ``def`` agent's thread, :func:`in_context`), and the client it hands to the
  agent checks, as it sends each request to the endpoint, which agent sends it (:func:`request_hooks`). Sent by its own agent (or from a thread no
  agent started, a framework's own pool), the request carries the trajectory's sender id (:data:`CALLER_HEADER`, a
  per-trajectory id that is not its key) as proof. Sent by another trajectory's agent, it is not sent at all: the
  sender's trajectory fails with :data:`MIXED`, and the trajectory whose client it was keeps its clean record. The
  server refuses a request whose header names another trajectory's agent the same way.
- **A key is bound to its conversation.** A request without that proof (a raw HTTP request, a client built from a
  base URL and key) may continue a conversation recorded for its key, never start another:
  :class:`~trl_agentic.agents.session.Session` answers 409 ``unproven_sender`` (:data:`UNPROVEN`) and records
  nothing. For an agent handed a client, whose own requests carry proof, that holds from the start. An agent that
  takes ``endpoint`` and builds its own client proves nothing unless it builds it over ``endpoint.http_client()``
  (the same hooks) or, for a client in another process (a CLI), has it send ``endpoint.headers``; its key is bound by the first conversation it receives, and a later one must open with the same
  messages (the same task, its history re-rendered by a framework or summarised), not another agent's.
"""

from __future__ import annotations

import contextvars
import secrets
from typing import Any, Callable

CALLER_HEADER = "x-trl-agentic-caller"
"""The header that names the trajectory whose agent sent a request (its ``caller_id``)."""

FIX = ("give each agent its own: pass the client the agent receives to its framework (e.g. OpenAIChatCompletionsModel"
       "(model=..., openai_client=client)); a client built from a base URL and key carries no proof of its sender")
MIXED = ("trajectories mixed: the agent sent a request through another trajectory's client or key (a process-wide "
         "client such as the Agents SDK's set_default_openai_client, or a client kept from another run); " + FIX)
UNPROVEN = ("not this trajectory's conversation: the request does not continue a conversation recorded for its key "
            "and carries no proof that this trajectory's agent sent it (a raw HTTP request, or a client built from a "
            "base URL and key, perhaps another trajectory's), so it is refused rather than trained under that "
            "trajectory's reward; send each agent's requests through the client the agent receives (agent(client, "
            "...)), or build the agent's clients over endpoint.http_client(), or send endpoint.headers with each "
            "request of a client in another process (a CLI agent): these carry that proof")

_running: contextvars.ContextVar[str | None] = contextvars.ContextVar("trl_agentic_caller", default=None)


class TrajectoriesMixed(RuntimeError):
    """Raised in an agent that sends a request through another trajectory's client (the request is not sent)."""


def new_caller_id() -> str:
    """A trajectory's sender id: random, and not its key (a leaked header gives no access to the record)."""
    return secrets.token_hex(16)


def running_as(caller_id: str) -> None:
    """Mark the current context (and the tasks and threads started from it) as the agent of trajectory
    ``caller_id``."""
    _running.set(caller_id)


def in_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` to run on another thread with the current task's marks (a plain ``def`` agent's worker thread)."""
    context = contextvars.copy_context()

    def run(*args: Any, **kwargs: Any) -> Any:
        return context.run(fn, *args, **kwargs)

    return run


def request_hooks(origin: str, owner: str, mixed: Callable[[str], None],
                  asynchronous: bool) -> dict[str, list[Callable[..., Any]]]:
    """``event_hooks`` for the HTTP client of the OpenAI client handed to the agent of trajectory ``owner``: each
    request to ``origin`` (``http://127.0.0.1:<port>``, the endpoint; no other host ever sees the header) carries
    ``owner`` as proof of its sender, unless another trajectory's agent sends it: then ``mixed(sender)`` is told and
    :class:`TrajectoriesMixed` is raised before anything is sent (module docstring)."""
    def stamp(request: Any) -> None:
        if not str(request.url).startswith(origin + "/"):
            return
        sender = _running.get()
        if sender is not None and sender != owner:
            mixed(sender)
            raise TrajectoriesMixed(MIXED)
        request.headers[CALLER_HEADER] = owner

    async def stamp_async(request: Any) -> None:
        stamp(request)

    return {"request": [stamp_async if asynchronous else stamp]}
