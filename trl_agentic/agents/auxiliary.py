"""Auxiliary calls: the requests a CLI agent makes beside its task's conversation (a session title, a summary of its
history, a classification, a quota check), recognized by their shape.

Recognized, in the two APIs these CLIs speak (Anthropic Messages, OpenAI Responses; chat and legacy completions
requests are always the task's), each from what the CLIs send (``tests/fixtures/cli_requests/``):

- ``quota_check``: a Messages request for one token with one message and no tools: Claude Code's quota, API-key
  and model checks (``max_tokens: 1``, the message ``"quota"``, ``"test"`` or ``"Hi"``). A one-token request with
  a conversation or tools (a classifier step of an agent) is the task's.
- Codex CLI's request kinds other than a turn: its ``client_metadata`` carries ``x-codex-turn-metadata`` (a JSON
  string) whose ``request_kind`` is ``"turn"`` for the task's conversation and, e.g., ``"compaction"`` for the summary
  it asks for when the context fills up; that kind names the call.
- ``structured_output``: a Messages request with a structured output format (``output_config.format``): Claude
  Code's session title (``{"title": ...}``) and its other classifier and namer calls. The format is not enforced
  (sampling is never constrained): the model's text is the answer, which the CLI checks.

An auxiliary call is answered as any other (the policy samples it, within the same budgets) and recorded in a
segment of its own that the task's conversation never extends (:class:`~trl_agentic.agents.session.Session`); it is
not trained unless ``Agent(train_auxiliary=True)`` (then a training row of its own), and it is counted
(``agentic/agent/auxiliary_per_trajectory``). A call with none of these shapes starts or extends a segment as any
request does.
"""

from __future__ import annotations

import json
from typing import Any

QUOTA_CHECK = "quota_check"
STRUCTURED_OUTPUT = "structured_output"
TURN = "turn"
"""Codex CLI's request kind for the task's conversation."""


def auxiliary_kind(data: dict[str, Any]) -> str | None:
    """The kind of auxiliary call a Messages or Responses request body (a JSON object) is (module docstring), or
    ``None`` for a request of the task's conversation."""
    messages, limit = data.get("messages"), data.get("max_tokens")
    if limit == 1 and not isinstance(limit, bool) and isinstance(messages, list) and len(messages) == 1 \
            and not data.get("tools"):
        return QUOTA_CHECK
    kind = _codex_request_kind(data.get("client_metadata"))
    if kind not in (None, TURN):
        return kind
    output = data.get("output_config")
    if isinstance(output, dict) and output.get("format") is not None:
        return STRUCTURED_OUTPUT
    return None


def _codex_request_kind(metadata: Any) -> str | None:
    """``request_kind`` of Codex CLI's turn metadata (a JSON string in ``client_metadata``), a short plain name or
    ``None``."""
    raw = metadata.get("x-codex-turn-metadata") if isinstance(metadata, dict) else None
    try:
        kind = json.loads(raw).get("request_kind") if isinstance(raw, str) and len(raw) < 65536 else None
    except (ValueError, AttributeError, RecursionError):
        return None
    return kind if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 40 else None
