"""``tool_choice="required"`` and a named function: the opening of a call is written, not sampled, and never trained.

OpenAI guarantees a call under these choices. Constraining every sampled token (a grammar) would sample from a
distribution other than the policy's while the trainer scores the tokens with the policy's own log-probs, so GRPO's
and PPO's ratios would compare the wrong numbers. Instead the turn *starts* with the text the chat template writes to
open a call (Qwen2.5: ``<tool_call>\\n{"name": "``; for a named function, up to its arguments:
``<tool_call>\\n{"name": "add", "arguments": ``). Those ids are recorded masked (0), like an observation; the model
samples the rest of the turn from the policy *given* them, which is exactly the distribution the trainer's log-probs
measure on the recorded sequence. Nothing forces the rest: the policy may still write a call that does not parse
(the reply then carries no call, counted ``malformed_tool_call``). The trade-off: in a forced turn the policy is not
trained to decide to call, only to write the call (``Agent(force_tool_choice=False)`` serves these choices unforced:
the policy samples freely and may answer without a call).

The opening is read from the chat template: the text after the generation prompt of an assistant turn that holds one
call and no text, up to the function's name (or up to its arguments). A template that writes no call (Gemma 3's) has
no opening: the choice is then served unforced (counted ``tool_choice_unforced``). A template that writes something
before every call writes it here too (Qwen3: an empty ``<think>`` block, so a forced turn holds no reasoning).
"""

from __future__ import annotations

import secrets
from typing import Any, Sequence

from ..rollout.observations import ObservationEncoder


def call_opening(encoder: ObservationEncoder, tools: Sequence[dict[str, Any]], name: str) -> str | None:
    """The text that opens a call to ``name`` (``""``: to any function, up to its name) right after the generation
    prompt, or ``None`` when the chat template writes no such opening."""
    marker = f"TRLAGENTIC{secrets.token_hex(4)}"
    context = [{"role": "user", "content": "?"}]
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": marker + "F", "arguments": {marker + "A": 0}}}]}
    try:
        prompt = encoder.render_text(context, add_generation_prompt=True, tools=list(tools))
        turn = encoder.render_text(context + [call], add_generation_prompt=False, tools=list(tools))
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
