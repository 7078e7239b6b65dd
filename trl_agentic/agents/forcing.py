"""``tool_choice="required"`` and a named function: the opening of a call is written, not sampled, and never trained.

OpenAI guarantees a call under these choices. Constraining every sampled token (a grammar) would sample from a
distribution other than the policy's while the trainer scores the tokens with the policy's own log-probs, so GRPO's
and PPO's ratios would compare the wrong numbers. Instead the turn *starts* with the ids the chat template writes to
open a call (Qwen2.5: ``<tool_call>\\n{"name": "``; for a named function, up to its arguments:
``<tool_call>\\n{"name": "add", "arguments":``). Those ids are recorded masked (0), like an observation; the model
samples the rest of the turn from the policy *given* them, which is exactly the distribution the trainer's log-probs
measure on the recorded sequence. Nothing forces the rest: the policy may still write a call that does not parse
(the reply then carries no call, counted ``malformed_tool_call``). The trade-off: in a forced turn the policy is not
trained to decide to call, only to write the call (``Agent(force_tool_choice=False)`` serves these choices unforced:
the policy samples freely and may answer without a call).

**Token-exact.** The opening's text is read from the chat template: the text after the generation prompt of an
assistant turn that holds one call and no text, up to the function's name (or up to its arguments). Its *ids* are the
template's own: the first ids of that turn tokenized together with the prompt, as the model saw its calls, cut at the
last token boundary inside the text (BPE merges across it: Qwen's call continues ``":`` then ``' {"'``, so the text's
trailing space, tokenized alone a lone ``' '`` the model never writes there, is left to the model). Under
``"required"`` the boundary holds for every offered function's name. The model therefore continues from a prefix of a
call exactly as its own calls are tokenized.

A template that writes no call (Gemma 3's), or whose call does not tokenize after its prompt as a continuation, has
no opening: the choice is then served unforced (counted ``tool_choice_unforced``). A template that writes something
before every call writes it here too (Qwen3: an empty ``<think>`` block, so a forced turn holds no reasoning).
"""

from __future__ import annotations

import json
import secrets
import threading
from typing import Any, Sequence

from ..rollout.observations import ObservationEncoder
from .prompt import tokenize_template

CONTEXT = [{"role": "user", "content": "?"}]
"""The conversation the openings are read after (they do not depend on it: they follow the generation prompt)."""


class CallOpenings:
    """The openings of one chat template's calls (:func:`opening_ids`), computed once per set of tools and function
    and kept (a forced request renders the conversation once per offered function). Thread-safe.

    Args:
        encoder: The engine's encoder in chat mode (the chat template, the tokenizer).
    """

    def __init__(self, encoder: ObservationEncoder) -> None:
        self.encoder = encoder
        self._kept: dict[tuple[str, str], list[int] | None] = {}
        self._lock = threading.Lock()

    def ids(self, tools: Sequence[dict[str, Any]], name: str) -> list[int] | None:
        """:func:`opening_ids` of ``tools`` and ``name``, kept."""
        key = (json.dumps(list(tools), sort_keys=True, default=str), name)
        with self._lock:
            if key not in self._kept:
                self._kept[key] = opening_ids(self.encoder, tools, name)
            return self._kept[key]


def opening_text(encoder: ObservationEncoder, tools: Sequence[dict[str, Any]], name: str) -> str | None:
    """The text that opens a call to ``name`` (``""``: to any function, up to its name) right after the generation
    prompt, or ``None`` when the chat template writes no such opening."""
    marker = f"TRLAGENTIC{secrets.token_hex(4)}"
    try:
        prompt = encoder.render_text(CONTEXT, add_generation_prompt=True, tools=list(tools))
        turn = encoder.render_text(CONTEXT + [_call(marker + "F", {marker + "A": 0})], add_generation_prompt=False,
                                   tools=list(tools))
    except Exception:  # noqa: BLE001 - jinja's TemplateError or the template's raise_exception(): no opening
        return None
    if not turn.startswith(prompt) or marker + "F" not in turn:
        return None
    turn = turn[len(prompt):]
    at_name = turn.index(marker + "F")
    if not name:
        return turn[:at_name]
    at_arguments = turn.rfind("{", 0, turn.find(marker + "A"))
    if at_arguments < at_name:
        return None
    return turn[:at_name] + name + turn[at_name + len(marker) + 1:at_arguments]


def opening_ids(encoder: ObservationEncoder, tools: Sequence[dict[str, Any]], name: str) -> list[int] | None:
    """The ids that open a call to ``name`` (``""``: to any of ``tools``) right after the generation prompt, ending on
    a token boundary of the template's own rendering of such a call (module docstring), or ``None`` when there is no
    such opening."""
    text = opening_text(encoder, tools, name)
    if text is None:
        return None
    functions = [t.get("function", t) for t in tools]
    called = [f for f in functions if f.get("name") == name] if name else functions
    try:
        prompt = encoder.render_text(CONTEXT, add_generation_prompt=True, tools=list(tools))
        turns = [encoder.render_text(CONTEXT + [_call(f["name"], _example_arguments(f))],
                                     add_generation_prompt=False, tools=list(tools)) for f in called]
    except Exception:  # noqa: BLE001 - as in opening_text
        return None
    prompt_ids = tokenize_template(encoder, prompt)
    common = tokenize_template(encoder, prompt + text)
    for turn in turns:
        ids = tokenize_template(encoder, turn)
        if ids[:len(prompt_ids)] != prompt_ids:  # the call does not continue the prompt's ids
            return None
        common = _shared_prefix(common, ids)
    return common[len(prompt_ids):] if called and len(common) > len(prompt_ids) else None


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant message holding one call and no text."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def _example_arguments(function: dict[str, Any]) -> dict[str, Any]:
    """Arguments shaped like a real call's (its first parameter), for the tokens where the arguments begin."""
    properties = (function.get("parameters") or {}).get("properties") or {}
    return {next(iter(properties)): 0} if properties else {}


def _shared_prefix(a: list[int], b: list[int]) -> list[int]:
    """The longest common prefix of two id lists."""
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:n]
