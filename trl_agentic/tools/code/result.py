"""What one code block did (:class:`ExecutionResult`), and how it is shown to the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base import ToolOutput, truncate_middle

STATE_LOST = "the interpreter was restarted and its state (variables, imports) was lost."


@dataclass
class ExecutionResult:
    """What one code block did.

    Attributes:
        stdout: Text written to standard output (Python ``print`` and the file descriptor), already bounded.
        stderr: Text written to standard error (warnings, subprocess errors...).
        error: The traceback (or the description of a timeout / crash / limit) when the block failed, else None.
        exit_status: None while the interpreter lives on; the process' exit status when it ended during this block
            (negative: killed by that signal).
        timed_out: The block ran past the wall-time limit (the worker was killed).
        output_truncated: Some output was dropped to respect the size limits.
        state_lost: The interpreter was (or had been) restarted: variables from earlier blocks are gone.
        duration_s: Wall time of the block, seconds.
        dropped_bytes: Output bytes dropped before the text was assembled (counted in the truncation marker).
    """

    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    exit_status: int | None = None
    timed_out: bool = False
    output_truncated: bool = False
    state_lost: bool = False
    duration_s: float = 0.0
    dropped_bytes: int = 0
    max_output_chars: int | None = field(default=None, repr=False)
    traceback_lines: int | None = field(default=20, repr=False)

    @property
    def ok(self) -> bool:
        """No error, no timeout."""
        return self.error is None and not self.timed_out

    def _error_text(self) -> str:
        if not self.error:
            return ""
        lines = self.error.rstrip("\n").split("\n")
        if self.traceback_lines and len(lines) > self.traceback_lines:
            lines = ["Traceback (most recent call last, truncated):"] + lines[-self.traceback_lines :]
        return "\n".join(lines)

    def to_observation(self, max_chars: int | None = None) -> str:
        """The text shown to the model: stdout, stderr, then the error's last lines; head and tail kept within
        ``max_chars`` (default: the sandbox's ``max_output_chars``)."""
        return self._observation(max_chars)[0]

    def _observation(self, max_chars: int | None = None) -> tuple[str, bool]:
        parts = [p for p in (self.stdout, self.stderr, self._error_text()) if p]
        text = ""
        for part in parts:
            if text and not text.endswith("\n"):
                text += "\n"
            text += part
        limit = self.max_output_chars if max_chars is None else max_chars
        text, cut = truncate_middle(text, limit, omitted_extra=self.dropped_bytes)
        return text, cut or self.output_truncated

    def to_tool_output(self, max_chars: int | None = None) -> ToolOutput:
        """The observation plus the flags the engine counts (``tool_error``, ``tool_timeout``, ...)."""
        text, truncated = self._observation(max_chars)
        info: dict[str, Any] = {"duration_s": round(self.duration_s, 4)}
        if self.exit_status is not None:
            info["exit_status"] = self.exit_status
        if self.state_lost:
            info["state_lost"] = True
        return ToolOutput(observation=text, error=self.error is not None, timeout=self.timed_out,
                          observation_truncated=truncated, info=info)
