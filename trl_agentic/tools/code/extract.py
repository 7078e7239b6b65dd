"""The code inside a model's tool call: the contents of its fenced blocks, or the whole text."""

from __future__ import annotations

import re

_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The code in ``text``: the contents of its fenced ```` ```python ```` blocks when it has any (ReTool writes
    ``<code>```python ... ```</code>``), else the text itself."""
    if not isinstance(text, str):
        return ""
    if "```" not in text:
        return text.strip("\n")
    blocks = _FENCE_RE.findall(text)
    if not blocks:
        return text.replace("```", "").strip("\n")
    return "\n".join(block.strip("\n") for block in blocks)
