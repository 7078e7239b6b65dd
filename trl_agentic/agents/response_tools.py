"""The Responses API's tool types as the chat functions a chat template renders, and a reply's calls as the output
items each type expects back.

Served tool types (the client runs every tool; the endpoint only samples the calls):

- ``function`` (``name``, ``description``, ``parameters``, ``strict``): a chat function with these fields, as sent.
- ``namespace`` (``name``, ``description``, ``tools``: functions): each function a chat function named
  ``<namespace>.<name>`` (what Codex CLI's ``multi_agent_v1`` holds), its description after the namespace's; a call
  the model writes to ``<namespace>.<name>`` is answered as a ``function_call`` item with ``namespace`` and the bare
  ``name``, as Codex reads it.
- ``custom`` (``name``, ``description``, ``format``: ``text`` or a ``grammar``): a freeform tool (Codex's
  ``apply_patch``) as a chat function with one string parameter, ``input``, whose description carries the format
  (the grammar's definition as sent; what is sampled is not constrained to it, the client checks it as it checks
  any input). A call is answered as a ``custom_tool_call`` item whose ``input`` is that string.

Any other type (``web_search``, ``file_search``, ``code_interpreter``, ``image_generation``, ``computer_use_preview``,
``mcp``, ``local_shell``, ...) is a tool the server would run, or one no tested client sends: refused (400) naming it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from .protocol import NAME, RequestError

CUSTOM_INPUT = "input"
"""The one parameter of a custom tool's chat function: the freeform text."""
SERVED = ("function", "namespace", "custom")


@dataclass(frozen=True)
class ToolKinds:
    """Which chat functions of a request stand for namespaced functions and which for custom tools.

    Attributes:
        namespaced: Chat name (``<namespace>.<name>``) to ``(namespace, name)``.
        custom: Chat names of custom tools.
    """

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    custom: frozenset[str] = frozenset()


def _fail(message: str, param: str) -> RequestError:
    return RequestError(400, message, param)


def chat_tools(value: Any) -> tuple[list[dict[str, Any]], ToolKinds]:
    """The request's ``tools`` as chat functions, and how their calls map back (module docstring); 400 naming the
    tool at the first one that is not served."""
    if value is None:
        return [], ToolKinds()
    if not isinstance(value, list):
        raise _fail("'tools' must be a list", "tools")
    tools: list[dict[str, Any]] = []
    namespaced: dict[str, tuple[str, str]] = {}
    custom: set[str] = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind == "function":
            tools.append(_function(tool, where))
        elif kind == "namespace":
            space, inner = _name(tool, where), tool.get("tools")
            if not isinstance(inner, list) or not inner:
                raise _fail(f"{where}.tools must be a non-empty list of functions", f"{where}.tools")
            for j, function in enumerate(inner):
                spot = f"{where}.tools[{j}]"
                if not isinstance(function, dict) or function.get("type", "function") != "function":
                    raise _fail(f"{spot}: a namespace holds function tools only", spot)
                chat = _function(function, spot, space, tool.get("description"))
                namespaced[chat["function"]["name"]] = (space, function["name"])
                tools.append(chat)
        elif kind == "custom":
            tools.append(_custom(tool, where))
            custom.add(tool["name"])
        else:
            raise _fail(f"{where}: {str(kind)[:40]!r} tools are not served: the endpoint runs no tool itself, it serves "
                        f"{', '.join(SERVED)} tools, which the client runs; leave it out (Codex CLI: web_search = "
                        "\"disabled\" in config.toml)", where)
    names = [tool["function"]["name"] for tool in tools]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise _fail(f"tools: {twice[:64]!r} is given twice", "tools")
    return tools, ToolKinds(namespaced, frozenset(custom))


def _name(tool: dict[str, Any], where: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise _fail(f"{where}.name must match {NAME.pattern}", f"{where}.name")
    return name


def _function(tool: dict[str, Any], where: str, namespace: str | None = None,
              namespace_description: Any = None) -> dict[str, Any]:
    """A function tool (flat, as Responses sends it) as a chat function; inside a namespace, named
    ``<namespace>.<name>`` and described after the namespace."""
    name = _name(tool, where)
    function = {k: v for k, v in tool.items() if k != "type"}
    if namespace is not None:
        function["name"] = f"{namespace}.{name}"
        if not NAME.match(function["name"]):
            raise _fail(f"{where}: {function['name'][:80]!r} (namespace.name) must match {NAME.pattern}", where)
        described = [d for d in (namespace_description, tool.get("description")) if isinstance(d, str) and d]
        if described:
            function["description"] = "\n\n".join(described)
    return {"type": "function", "function": function}


def _custom(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom (freeform) tool as a chat function with one string parameter, ``input``, described by its format."""
    name = _name(tool, where)
    form = tool.get("format", {"type": "text"})
    if not isinstance(form, dict) or form.get("type") not in ("text", "grammar"):
        raise _fail(f"{where}.format must be {{'type': 'text'}} or {{'type': 'grammar', 'syntax', 'definition'}}",
                    f"{where}.format")
    about = "The tool's input, as free text."
    if form["type"] == "grammar":
        if not isinstance(form.get("definition"), str) or not isinstance(form.get("syntax"), str):
            raise _fail(f"{where}.format: a grammar needs 'syntax' and 'definition' strings", f"{where}.format")
        about = f"The tool's input, as free text in this {form['syntax']} grammar:\n{form['definition']}"
    function: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    function["parameters"] = {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string", "description": about}},
                              "required": [CUSTOM_INPUT]}
    return {"type": "function", "function": function}


def output_item(call: dict[str, Any], kinds: ToolKinds, done: bool = True) -> dict[str, Any]:
    """The output item of one call of a reply (``{"id", "function": {"name", "arguments": dict}}``): a
    ``custom_tool_call`` for a custom tool, else a ``function_call`` (with ``namespace`` for a namespaced function);
    while streaming (``done=False``), its arguments or input still empty."""
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    status = "completed" if done else "in_progress"
    if name in kinds.custom:
        given = arguments.get(CUSTOM_INPUT) if isinstance(arguments, dict) and len(arguments) == 1 else None
        text = given if isinstance(given, str) else json.dumps(arguments, ensure_ascii=False)
        return {"type": "custom_tool_call", "id": f"ctc_{uuid.uuid4().hex}", "call_id": call["id"], "name": name,
                "input": text if done else "", "status": status}
    item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"], "name": name,
            "arguments": json.dumps(arguments, ensure_ascii=False) if done else "", "status": status}
    if name in kinds.namespaced:
        item["namespace"], item["name"] = kinds.namespaced[name]
    return item


def history_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` input item (a call the client was given earlier) as a chat call,
    named and argued as :func:`output_item` answered it, so that it matches what was recorded."""
    fields = ("call_id", "name", "arguments") if item["type"] == "function_call" else ("call_id", "name", "input")
    for name in fields:
        if not isinstance(item.get(name), str):
            raise _fail(f"{where}.{name} must be a string", f"{where}.{name}")
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise _fail(f"{where}.namespace must be a string", f"{where}.namespace")
    name = f"{namespace}.{item['name']}" if namespace else item["name"]
    arguments = item["arguments"] if item["type"] == "function_call" else {CUSTOM_INPUT: item["input"]}
    return {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": arguments}}
