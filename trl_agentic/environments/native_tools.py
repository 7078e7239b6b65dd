"""Native tool calling: the model calls tools in its chat template's own format, and the results come back as
``role: tool`` messages.

This is the form TRL's ``GRPOTrainer(tools=...)`` and instruct models use (Qwen2.5/Qwen3 ``<tool_call>{json}
</tool_call>``, Llama-3.x JSON, ...), as opposed to the text tags of :class:`~trl_agentic.TagEnvironment`. Nothing
here parses a tool-call format: the family's response template does (transformers' ``parse_response`` through TRL's
:func:`trl_agentic.compat.parse_response`, set up by :func:`trl.add_response_schema`).

One turn, in the engine's chat mode:

1. the prompt is rendered with the tools' JSON schemas (``apply_chat_template(..., tools=tools)``);
2. the model's sampled ids are kept as they are, and parsed into an assistant message (:func:`parse_turn`);
3. :meth:`ToolCallEnvironment.step` runs the message's tool calls, each under ``tool_timeout``: as TRL 1.16 does,
   sync tools one after another on the rollout's thread (``sync_tools_on_caller_thread``; or concurrently on
   worker threads) and async tools concurrently;
4. the results, one ``{"role": "tool", "name": ..., "content": result}`` message per call (``str(result)``, or a
   list of content parts kept as the tool returned it, as TRL does), are rendered by the chat template and appended
   as masked observation tokens (:meth:`ObservationEncoder.encode_observation`).

A turn without a tool call ends the episode (``terminated``), as in TRL; so does, by default, a turn whose call the
template's parser cannot read (TRL's parser falls back to text; ``info["invalid"]``). Every bad call that was parsed
costs that call alone: the model reads ``{'error': '...'}`` as its result (TRL's error format) and the trajectory
goes on. Two options differ from TRL: ``answer_malformed_calls`` answers an unparsable call with an error instead of
ending the episode, ``check_argument_types`` answers an argument whose JSON type is not the one the tool's schema
declares with an error before the tool runs (TRL calls the tool with it). Counted per turn in ``info``
(:mod:`trl_agentic.rollout.metrics`): ``tool`` (the names called, always a list), ``tool_calls``, ``tool_error`` (a
call that raised, timed out, named no tool or had wrong arguments: TRL's tool failures), ``unknown_tool``,
``tool_timeout``, ``invalid`` (an unparsable call).
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from typing import Any, Callable, Sequence

from ..tools.base import call_tool, tool_error
from .base import StepResult

RESERVED_METHODS = ("reset", "get_reward")
"""Methods of a TRL environment that are not tools (TRL 1.16's contract)."""


def tool_methods(instance: Any) -> list[Callable[..., Any]]:
    """The public methods of an environment instance that TRL exposes as tools: every function defined on its class
    whose name does not start with ``_``, except ``reset`` and ``get_reward`` (read on the class, so properties are
    not evaluated), bound to the instance."""
    return [getattr(instance, name) for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in RESERVED_METHODS and not name.startswith("_")]


def check_tool_schema(tool: Callable[..., Any]) -> None:
    """Raise a one-line ``ValueError`` naming ``tool`` when transformers' ``get_json_schema`` cannot describe it (no
    docstring, a parameter without a type hint or an ``Args:`` line): the chat template renders every tool's schema
    at every rollout, where such a tool would fail."""
    problem = tool_schema_problem(tool)
    if problem is not None:
        raise ValueError(problem)


def tool_schema_problem(tool: Any) -> str | None:
    """One line saying why the chat template cannot be given ``tool`` (a callable transformers' ``get_json_schema``
    cannot describe), else ``None``: a tool that carries its own schema (:func:`rendered_tool`) or a schema dict is
    described. Read once per function (a bound method's answer holds for every instance)."""
    if isinstance(rendered_tool(tool), dict) or not callable(tool):
        return None
    key = getattr(tool, "__func__", tool)
    if key not in _SCHEMA_PROBLEMS:
        from transformers.utils import get_json_schema
        from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

        try:
            get_json_schema(tool)
            _SCHEMA_PROBLEMS[key] = None
        except (DocstringParsingException, TypeHintParsingException) as exc:
            name = getattr(tool, "__qualname__", getattr(tool, "__name__", repr(tool)))
            _SCHEMA_PROBLEMS[key] = (f"tool {name!r} cannot be described to the model ({str(exc).splitlines()[0]}): "
                                     "give it type hints and a Google-style docstring, a summary line and an Args: "
                                     "line per parameter")
    return _SCHEMA_PROBLEMS[key]


_SCHEMA_PROBLEMS: "weakref.WeakKeyDictionary[Any, str | None]" = weakref.WeakKeyDictionary()
"""What :func:`tool_schema_problem` found for each function (weak keys: a function that goes away leaves no entry)."""


def rendered_tool(tool: Any) -> Any:
    """What the chat template (``apply_chat_template(tools=...)``) and the response parser are given for ``tool``: the
    JSON schema of a tool that carries its own (a ``json_schema`` dict, ``{"type": "function", "function": {...}}``:
    a tool described by a listing, such as an MCP server's, rather than by a Python signature), else the callable,
    whose schema transformers reads from its type hints and docstring (``get_json_schema``)."""
    schema = getattr(tool, "json_schema", None)
    return schema if isinstance(schema, dict) else tool


def ensure_response_parser(processing_class: Any) -> Any:
    """Give ``processing_class`` the response template of its chat template's family (TRL's ``add_response_schema``) unless
    it has one; raises a one-line ``ValueError`` when the family is unknown. Returns the tokenizer."""
    from trl import add_response_schema

    inner = getattr(processing_class, "tokenizer", processing_class)
    if getattr(inner, "response_template", None) is None and getattr(inner, "response_schema", None) is None:
        try:
            add_response_schema(processing_class)
        except ValueError:
            raise ValueError(
                f"native tool calls need a response template to parse the model's calls, and TRL knows none for the "
                f"chat template of {getattr(inner, 'name_or_path', type(inner).__name__)!r}; set "
                "tokenizer.response_template (transformers' response parsing) or use TagEnvironment's text tags"
            ) from None
    return processing_class


def parse_turn(processing_class: Any, ids: Sequence[int], prefix: Sequence[int], tools: Sequence[Any]) -> dict[str, Any]:
    """The assistant message of one turn: TRL's ``parse_response`` (``content``, and ``tool_calls`` with arguments
    typed by the tools' schemas). When the turn holds a call the parser cannot read, TRL falls back to plain text;
    the message then also carries ``"malformed"``: the parser's error."""
    from ..compat import parse_response

    inner = getattr(ensure_response_parser(processing_class), "tokenizer", processing_class)
    message = parse_response(inner, ids, prefix, tools)
    if not message.get("tool_calls"):
        try:
            inner.parse_response(list(ids), prefix=list(prefix), tools=list(tools) or None)
        except (ValueError, TypeError) as exc:  # what TRL's fallback swallowed
            message["malformed"] = str(exc).splitlines()[0]
    return message


def _text(value: Any) -> str:
    """A tool's result as TRL writes it (``str(result)``), with invalid Unicode replaced."""
    return str(value).encode("utf-8", errors="replace").decode("utf-8")


class ToolCallEnvironment:
    """An environment whose actions are native tool calls (see the module docstring).

    Args:
        tools: Callables (sync or async) with type hints and a Google-style docstring, as for transformers'
            ``apply_chat_template(tools=...)``, or callables that carry their own JSON schema (``json_schema``:
            :func:`rendered_tool`); their ``__name__`` is the tool's name.
        tool_timeout: Seconds one tool call may take; a slower call answers ``{'error': '... timed out ...'}``.
        sequential: Tools that run one after another, in the order called (the methods of one stateful
            environment instance); with ``sync_tools_on_caller_thread`` every sync tool does.
        sync_tools_on_caller_thread: Run sync tools, one after another, on the thread that runs the rollout, as TRL
            1.16 does (:func:`~trl_agentic.workers.run_on_caller_thread`: a tool may use ``signal.alarm`` or a
            thread-bound resource); ``False`` runs them concurrently on worker threads.
        answer_malformed_calls: A turn with a tool call the response template cannot parse: ``False`` (TRL) ends the
            rollout, the turn being its last; ``True`` answers it with ``{'error': 'could not parse ...'}`` and the
            model tries again.
        check_argument_types: Answer an argument whose JSON type is not the one the tool's schema declares with an
            error, before the tool runs (``False``: the tool is called with it, as TRL does).

    ``step`` receives the parsed assistant message (:func:`parse_turn`), not text. The tool messages of a turn come
    in TRL's order: the sync calls (and the calls that failed before running) in call order, then the async ones.
    """

    stop_strings: Sequence[str] = ()
    action_format = "message"  # step() receives the parsed assistant message

    def __init__(self, tools: Sequence[Callable[..., Any]] = (), tool_timeout: float = 30.0,
                 sequential: Sequence[Callable[..., Any]] = (), sync_tools_on_caller_thread: bool = False,
                 answer_malformed_calls: bool = False, check_argument_types: bool = False) -> None:
        if isinstance(tools, dict) or not all(callable(tool) for tool in tools):
            raise TypeError("tools must be a list of functions (each with type hints and a docstring)")
        self.tools = list(tools)
        self.tool_timeout = tool_timeout
        self.sequential = list(sequential)
        self.sync_tools_on_caller_thread = sync_tools_on_caller_thread
        self.answer_malformed_calls = answer_malformed_calls
        self.check_argument_types = check_argument_types

    @property
    def runs_on_caller_thread(self) -> bool:
        """Whether the engine runs this environment's sync methods on the rollout's thread
        (:mod:`trl_agentic.rollout.env_calls`): when its sync tools run there."""
        return self.sync_tools_on_caller_thread

    def reset(self, **row: Any) -> str | None:
        return None

    async def step(self, message: dict[str, Any]) -> StepResult:
        """Run the message's tool calls; the results are the observation (a list of ``tool`` messages)."""
        calls = list(message.get("tool_calls") or [])
        info: dict[str, Any] = {"tool": [], "tool_calls": len(calls), "tool_error": 0, "unknown_tool": 0,
                                "tool_timeout": 0}
        if not calls and "malformed" in message:
            info.update(invalid=1)
            if not self.answer_malformed_calls:  # TRL: the parser fell back to text, so the rollout ends here
                return StepResult(observation=None, terminated=True, info=info)
            content = tool_error(f"could not parse the tool call: {message['malformed']}")
            return StepResult(observation=[{"role": "tool", "name": "unknown", "content": content}], info=info)
        if not calls:
            return StepResult(observation=None, terminated=True, info=info)
        by_name = {tool.__name__: tool for tool in self.tools}
        results: list[Any] = [None] * len(calls)

        async def run(i: int) -> None:
            results[i] = await self._call(calls[i], by_name, info)

        async def in_order(indices: list[int]) -> None:
            for i in indices:
                await run(i)

        deferred = [i for i, call in enumerate(calls) if inspect.iscoroutinefunction(by_name.get(_name(call)))
                    and call.get("type", "function") == "function"]
        immediate = [i for i in range(len(calls)) if i not in deferred]
        sequential = {tool.__name__ for tool in self.sequential}
        in_turn = [i for i in immediate if self.sync_tools_on_caller_thread or _name(calls[i]) in sequential]
        await asyncio.gather(in_order(in_turn), *(run(i) for i in range(len(calls)) if i not in in_turn))
        order = immediate + deferred  # TRL's: sync results (and early failures) first, then async ones
        names = [_name(calls[i]) for i in order]
        info["tool"] = names
        info["calls"] = [{"name": _name(calls[i]), "arguments": _arguments(calls[i])} for i in order]
        observation = [{"role": "tool", "name": name, "content": results[i]} for name, i in zip(names, order)]
        return StepResult(observation=observation, info=info)

    async def _call(self, call: dict[str, Any], by_name: dict[str, Callable[..., Any]], info: dict[str, Any]) -> Any:
        """One call's result: a list as it came (content parts, TRL keeps it), anything else as text; a failure
        is counted in ``info`` and answered with TRL's error content."""
        name, arguments = _name(call), _arguments(call)
        if call.get("type", "function") != "function":
            info["tool_error"] += 1
            return tool_error(f"Unsupported tool call type: {call.get('type')}")
        tool = by_name.get(name)
        if tool is None:
            info["tool_error"] += 1
            info["unknown_tool"] += 1
            return tool_error(f"Tool {name} not found.")
        if not isinstance(arguments, dict):
            info["tool_error"] += 1
            return tool_error(f"arguments of {name} must be a JSON object, got {type(arguments).__name__}")
        mistyped = argument_type_error(tool, arguments) if self.check_argument_types else None
        if mistyped:
            info["tool_error"] += 1
            return tool_error(mistyped)
        call = await call_tool(tool, kwargs=arguments, timeout=self.tool_timeout,
                               on_caller_thread=self.sync_tools_on_caller_thread)
        if call.error is not None:
            info["tool_error"] += 1
            info["tool_timeout"] += int(call.timed_out)
            return tool_error(f"{name} {call.error}" if call.timed_out else call.error)  # TRL's: the message alone
        return call.value if isinstance(call.value, list) else _text(call.value)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,), "array": (list, tuple),
    "object": (dict,), "null": (type(None),),
}


def argument_type_error(tool: Callable[..., Any], arguments: dict[str, Any]) -> str | None:
    """Why an argument does not have the JSON type the tool's schema (the schema the model was shown:
    :func:`rendered_tool`) declares, or ``None``. Names and missing arguments are left to the call itself (its
    ``TypeError`` is the error TRL reports)."""
    from transformers.utils import get_json_schema

    try:
        schema = rendered_tool(tool)
        schema = schema if isinstance(schema, dict) else get_json_schema(tool)
        properties = schema["function"]["parameters"].get("properties", {})
    except Exception:  # noqa: BLE001 - a tool without a usable schema: nothing to check against
        return None
    for name, value in arguments.items():
        declared = properties.get(name, {}).get("type")
        kinds = [declared] if isinstance(declared, str) else list(declared or [])
        allowed = tuple(t for kind in kinds for t in _JSON_TYPES.get(kind, (object,)))
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            return f"argument {name!r} of {getattr(tool, '__name__', 'tool')} must be {' or '.join(kinds)}, got {value!r}"
    return None


def _name(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    return str(function.get("name", "unknown"))


def _arguments(call: dict[str, Any]) -> Any:
    function = call.get("function", call)
    arguments = function.get("arguments")
    return {} if arguments is None else arguments


def native_tools(env: Any) -> list[Any] | None:
    """The tools of an environment whose actions are messages (``action_format = "message"``: a
    :class:`ToolCallEnvironment`), read after ``reset`` (they may depend on the row), as the chat template is given
    them (:func:`rendered_tool`); ``None`` for an environment whose actions are text (the protocol's default,
    :attr:`~trl_agentic.Environment.action_format`)."""
    if getattr(env, "action_format", "text") != "message":
        return None
    return [rendered_tool(tool) for tool in getattr(env, "tools", ())]
