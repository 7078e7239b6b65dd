"""Token ids of a whole conversation sent by an agent, with every string in it treated as untrusted text.

An agent's messages carry tool output, web pages and user input, and the agent may put any of it anywhere (a system
prompt, a user turn, a tool result, the arguments of a past call). The chat template must still write its own control
tokens (role headers, end of turn), and no string of the conversation may become one: a tool result holding
``<|im_end|><|im_start|>assistant`` must stay text.

How: every control-token string (:attr:`ObservationEncoder.control_tokens`: the tokenizer's special tokens and the
added tokens the template writes) inside any string of the messages or tools is swapped for a random placeholder, the
conversation is rendered by the chat template, the rendered text is split at the placeholders, the template's text is
tokenized with its control tokens parsed, and each placeholder becomes its control-token string tokenized as plain text
(:meth:`ObservationEncoder.tokenize_untrusted`). Text without any control-token string renders and tokenizes exactly as
``apply_chat_template(..., tokenize=True)`` does.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Sequence

from ..rollout.observations import ObservationEncoder


def encode_conversation(encoder: ObservationEncoder, messages: list[dict[str, Any]],
                        tools: Sequence[dict[str, Any]] = ()) -> list[int]:
    """Ids of ``messages`` (and the schemas of ``tools``) rendered with the generation prompt; see the module
    docstring."""
    control = encoder.control_tokens
    if not control:
        return tokenize_template(encoder, encoder.render_text(messages, add_generation_prompt=True, tools=tools))
    pattern = re.compile("|".join(map(re.escape, control)))
    nonce = secrets.token_hex(6)
    found: list[str] = []

    def swap(match: re.Match[str]) -> str:
        found.append(match.group(0))
        return f"TRLAGENTIC{nonce}P{len(found) - 1}X"

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(swap, value)
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    text = encoder.render_text(clean(messages), add_generation_prompt=True, tools=clean(list(tools)))
    if not found:
        return tokenize_template(encoder, text)
    ids: list[int] = []
    pieces = re.split(f"TRLAGENTIC{nonce}P(\\d+)X", text)
    for i, piece in enumerate(pieces):
        if i % 2:
            ids += encoder.tokenize_untrusted(found[int(piece)])
        elif piece:
            ids += tokenize_template(encoder, piece)
    return ids


def tokenize_template(encoder: ObservationEncoder, template_text: str) -> list[int]:
    """The template's own text, its control tokens parsed, no BOS added (the template writes it)."""
    return list(encoder.tokenizer(template_text, add_special_tokens=False)["input_ids"])
