"""The search task through TRL's own interface: an ``environment_factory`` class, or ``tools=[search]`` and a
reward function, over Search-R1-format files (``benchmarks/learning/make_task.py`` makes one- and two-hop ones).

- ``environment_factory=partial(SearchEnvironment, tool)``: one instance per rollout, ``reset(**row)`` keeps the
  row's gold answers, two tool methods, ``search(query)`` (BM25, the top passages as Search-R1 renders them) and
  ``answer(answer)`` (records the final answer), and ``get_reward()``: exact match of the last recorded answer
  (SQuAD-normalised, :func:`trl_agentic.rewards.verifiers.qa.exact_match`; 0 without one). TRL's environments see
  tool calls only, never the model's last message, so the answer is a tool call here.
- ``tools=[search_function(tool)]`` with :func:`final_answer_em`: the same search; the answer is the content of the
  last assistant message (the turn without a tool call that ends the rollout).
- ``agent=search_agent(tool, max_turns)`` with :func:`agent_answer_em` (issue 34): the environment interface written
  as an OpenAI SDK agent, run against the policy through our OpenAI-compatible endpoint: the same prompt, the same
  ``search`` and ``answer`` tools (their JSON schemas, as transformers derives them from the methods), TRL's loop
  (a reply without a tool call ends it, at most ``max_turns`` model calls); the agent returns the submitted answer.

Whatever the trainer passes, the figures of a rollout are read from its messages (TRL's message lists, or
``Trajectory.messages``) by :func:`conversation_stats`: search and answer calls, malformed calls (a ``<tool_call>``
the response template could not read: it stays in the message's text) and model turns. :func:`metric_functions` are
reward functions of weight 0 that hand these to the trainer's logs (``rewards/<name>/mean``), so that TRL's
``GRPOTrainer`` and ours log the same per-step curves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from trl_agentic.rewards.verifiers.qa import exact_match

INSTRUCTIONS = {
    "environment": "Use the search tool to find the facts, then call the answer tool with the answer alone.",
    "agent": "Use the search tool to find the facts, then call the answer tool with the answer alone.",
    "tools": "Use the search tool to find the facts, then reply with the answer alone.",
}
"""The user message's first line, per interface."""

ANSWER_RECEIVED = "Answer recorded."
"""What ``SearchEnvironment.answer`` returns."""


class SearchEnvironment:
    """A TRL environment (``environment_factory=functools.partial(SearchEnvironment, tool)``) of the search task:
    tools ``search`` and ``answer``, reward ``get_reward`` (module docstring).

    Args:
        tool: The search tool (:class:`trl_agentic.tools.SearchTool`), shared by every instance.
    """

    def __init__(self, tool: Any) -> None:
        self._tool = tool
        self._golds: list[str] = []
        self.submitted: str | None = None

    def reset(self, golden_answers: Sequence[str] | str = (), **row: Any) -> None:
        self._golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
        self.submitted = None

    def search(self, query: str) -> str:
        """
        Search the encyclopedia for passages about people.

        Args:
            query: The search query, e.g. a question or a name.

        Returns:
            The top passages.
        """
        return self._tool.invoke(query).observation

    def answer(self, answer: str) -> str:
        """
        Submit the final answer to the question.

        Args:
            answer: The answer alone, in a few words.

        Returns:
            A confirmation.
        """
        self.submitted = answer
        return ANSWER_RECEIVED

    def get_reward(self) -> float:
        return exact_match(self.submitted, self._golds)


def environment_factory(tool: Any) -> Callable[[], SearchEnvironment]:
    """TRL's ``environment_factory`` for ``tool``: a zero-argument callable that builds a :class:`SearchEnvironment`."""
    return functools.partial(SearchEnvironment, tool)


def search_function(tool: Any) -> Callable[[str], str]:
    """TRL's ``tools=`` entry: a standalone ``search(query)`` over ``tool`` (the environment's docstring)."""

    def search(query: str) -> str:
        return tool.invoke(query).observation

    search.__doc__ = SearchEnvironment.search.__doc__
    return search


def tool_schemas(interface: str, tool: Any) -> list[Callable[..., Any]]:
    """The tools the model is shown for ``interface`` (``"environment"`` and ``"agent"``: the methods of an
    instance, in TRL's order, by name; ``"tools"``: the standalone search)."""
    from trl_agentic.environments.native_tools import tool_methods

    if interface in ("environment", "agent"):
        return tool_methods(SearchEnvironment(tool))
    return [search_function(tool)]


def tool_loop_agent(make_environment: Callable[[], Any], max_turns: int,
                    result: Callable[[Any, str | None], Any]) -> Callable[..., Any]:
    """An environment's tools as an agent of the OpenAI SDK, in TRL's loop: ``async def agent(client, prompt,
    **row)`` calls the model with the JSON schemas of a fresh environment's tool methods (as transformers derives
    them), runs each call on that environment (an error is the model's to read, as in TRL's loop), stops at a reply
    without a tool call or after ``max_turns`` model calls, and returns ``result(environment, reply)`` (the last
    reply's content, ``None`` when the turns ran out inside a call)."""
    import asyncio
    import json

    from transformers.utils import get_json_schema

    from trl_agentic.environments.native_tools import tool_methods

    schemas = [get_json_schema(method) for method in tool_methods(make_environment())]

    async def agent(client: Any, prompt: list[dict[str, Any]], **row: Any) -> Any:
        environment = make_environment()
        methods = {method.__name__: method for method in tool_methods(environment)}
        messages, reply = [dict(message) for message in prompt], None
        for _ in range(max_turns):
            response = await client.chat.completions.create(model="policy", messages=messages, tools=schemas)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                reply = message.content
                break
            for call in message.tool_calls:
                method = methods.get(call.function.name)
                try:
                    if method is None:
                        raise ValueError(f"unknown tool {call.function.name!r}")
                    output = await asyncio.to_thread(method, **json.loads(call.function.arguments))
                except Exception as exc:  # noqa: BLE001 - the model reads the error, as in TRL's loop
                    output = json.dumps({"error": str(exc)})
                messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                 "content": output})
        return result(environment, reply)

    return agent


def search_agent(tool: Any, max_turns: int) -> Callable[..., Any]:
    """The environment interface as an agent of the OpenAI SDK (module docstring, :func:`tool_loop_agent`): it
    returns the answer the environment received (``None`` without one)."""
    return tool_loop_agent(functools.partial(SearchEnvironment, tool), max_turns,
                           lambda environment, reply: environment.submitted)


# -- reading a rollout's messages ------------------------------------------------------------------------------


def _messages(completion: Any) -> list[dict[str, Any]]:
    """A completion as a message list (TRL's tool loop passes one; text is one assistant message)."""
    if isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    return list(completion or [])


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        calls.append((str(function.get("name")), function.get("arguments")))
    return calls


def submitted_answer(messages: Sequence[dict[str, Any]]) -> str | None:
    """The argument of the last ``answer`` call that the environment received (its tool message is the
    confirmation, not an error), as :meth:`SearchEnvironment.get_reward` reads it; ``None`` without one."""
    answer = None
    messages = list(messages)
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        results = []
        for later in messages[k + 1:]:
            if later.get("role") != "tool":
                break
            results.append(_text(later.get("content")))
        for (name, arguments), result in zip(_calls(message), results):
            if name == "answer" and result == ANSWER_RECEIVED and isinstance(arguments, dict):
                answer = arguments.get("answer")
    return answer if isinstance(answer, str) else None


def final_message(messages: Sequence[dict[str, Any]]) -> str | None:
    """The content of the last assistant message when it calls no tool (the rollout's reply), else ``None``."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    if not assistant or assistant[-1].get("tool_calls"):
        return None
    return _text(assistant[-1].get("content")).strip()


def conversation_stats(messages: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per rollout: ``calls`` (parsed tool calls, whatever their name), ``searches``, ``answers`` and
    ``calculations`` (the arithmetic task's ``calculate``) among them, ``malformed`` (``<tool_call>`` blocks left
    unparsed in the assistant text), ``turns`` (assistant messages)."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    names = [name for m in assistant for name, _ in _calls(m)]
    return {"calls": len(names), "searches": names.count("search"), "answers": names.count("answer"),
            "calculations": names.count("calculate"),
            "malformed": sum(_text(m.get("content")).count("<tool_call>") for m in assistant),
            "turns": len(assistant)}


def rollout_messages(completions: Sequence[Any], trajectory: Sequence[Any] | None = None) -> list[list[dict]]:
    """Each rollout's messages: the trajectory's (``Trajectory.messages``) when given and not empty, else the
    completion's (TRL's message lists)."""
    if trajectory is not None:
        return [list(t.messages) if t.messages else _messages(c) for t, c in zip(trajectory, completions)]
    return [_messages(c) for c in completions]


# -- reward functions ------------------------------------------------------------------------------------------


def final_answer_em(completions: Sequence[Any], golden_answers: Sequence[Any], trajectory: Sequence[Any] | None = None,
                    **kwargs: Any) -> list[float]:
    """TRL reward function of the ``tools=`` interface: exact match of the rollout's reply (:func:`final_message`)."""
    return [exact_match(final_message(m), g) for m, g in zip(rollout_messages(completions, trajectory), golden_answers)]


def submitted_answer_em(completions: Sequence[Any], golden_answers: Sequence[Any],
                        trajectory: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
    """The ``environment`` interface's reward read from the messages (:func:`submitted_answer`): what
    ``get_reward`` returns, for code that has the rollout but not its environment instance (evaluation)."""
    return [exact_match(submitted_answer(m), g)
            for m, g in zip(rollout_messages(completions, trajectory), golden_answers)]


def agent_answer_em(completions: Sequence[Any], golden_answers: Sequence[Any], agent_output: Sequence[Any],
                    **kwargs: Any) -> list[float]:
    """The ``agent`` interface's training reward: exact match of the answer the agent returned (what
    ``get_reward`` returns for the environment interface)."""
    return [exact_match(answer if isinstance(answer, str) else None, g) for answer, g in zip(agent_output, golden_answers)]


def outcome_reward(interface: str) -> Callable[..., list[float]]:
    """The reward the evaluation scores for ``interface`` (the agent's: read from its messages, as the
    environment's)."""
    return final_answer_em if interface == "tools" else submitted_answer_em


def _metric(key: str) -> Callable[..., list[float]]:
    def metric(completions: Sequence[Any], trajectory: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
        return [float(conversation_stats(m)[key]) for m in rollout_messages(completions, trajectory)]

    metric.__name__ = metric.__qualname__ = key
    metric.__doc__ = f"The rollout's {key} (:func:`conversation_stats`), logged as a reward of weight 0."
    return metric


METRICS = ("searches", "malformed", "turns")
"""The search task's logged metrics (the arithmetic task logs ``calculations`` in place of ``searches``)."""


def metric_functions(keys: Sequence[str] = METRICS) -> list[Callable[..., list[float]]]:
    """Reward functions of weight 0 whose per-step means the trainers log: by default searches, malformed calls,
    turns."""
    return [_metric(key) for key in keys]
