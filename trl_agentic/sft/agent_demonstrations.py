"""Demonstrations for an agent of any framework (``agent=``), replayed through the agent itself.

An agent writes its own requests (system prompt, tools, history) and runs its own tools, so what RL trains on is
what its requests render to at the OpenAI-compatible endpoint (:mod:`trl_agentic.agents`). A demonstration
(``{"prompt", "completion": [messages]}``) is replayed by running the agent on its row against the endpoint, with a
scripted generator in place of the model: the agent's ``k``-th model call is answered with the ``k``-th assistant
message of the demonstration, as the chat template writes it up to its end of turn (the ids the model would
sample). The agent calls its tools for real and sends the next request; what the endpoint records, segment by
segment, is the SFT data, in RL's token layout. The demonstration's ``tool`` messages are not used: the agent's tools
answer. A demonstration the agent does not follow (it asks for more turns than written, fewer, or fails) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..rollout.generation import Generation, get_eos_token_ids
from ..rollout.observations import ObservationEncoder
from .errors import DemonstrationError

__all__ = ["AgentReplay", "assistant_turn_ids"]


def assistant_turn_ids(encoder: ObservationEncoder, message: dict[str, Any]) -> list[int]:
    """The ids the model samples for an assistant ``message``: the chat template's rendering of it after a user
    turn, up to and including its end-of-turn id."""
    history = [{"role": "user", "content": "x"}]
    before = encoder.render_text(history, add_generation_prompt=True)
    after = encoder.render_text([*history, dict(message)], add_generation_prompt=False)
    end = encoder.tokenizer.convert_ids_to_tokens(encoder.layout.end_of_turn_id)
    if not after.startswith(before) or end not in after[len(before):]:
        raise DemonstrationError("the chat template does not render this assistant message as a continuation")
    delta = after[len(before):]
    text = delta[: delta.index(end)]
    return list(encoder.tokenizer(text, add_special_tokens=False)["input_ids"]) + [encoder.layout.end_of_turn_id]


class _ScriptedTurns:
    """The generation seam for one agent run: its ``k``-th model call gets the ``k``-th scripted turn."""

    def __init__(self, turns: list[list[int]], generation_config: Any = None) -> None:
        self.turns = turns
        self.generation_config = generation_config
        self.calls = 0

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str],
                 eos_token_ids: Sequence[int]) -> list[Generation]:
        out = []
        for _ in prompts:
            k, self.calls = self.calls, self.calls + 1
            out.append(Generation(ids=list(self.turns[k]) if k < len(self.turns) else [eos_token_ids[0]]))
        return out


def _turns(encoder: ObservationEncoder, completion: Any) -> list[list[int]]:
    if not isinstance(completion, list) or not all(isinstance(m, dict) for m in completion):
        raise DemonstrationError("an agent's demonstration is a list of messages (its assistant turns)")
    messages = [m for m in completion if m.get("role") == "assistant"]
    if not messages:
        raise DemonstrationError("an agent's demonstration needs at least one assistant message")
    return [assistant_turn_ids(encoder, m) for m in messages]


class AgentReplay:
    """Replays demonstrations through an agent (module docstring), one endpoint for all of them; :meth:`close` stops
    it.

    Args:
        processing_class: The policy's tokenizer.
        entry: The :class:`~trl_agentic.kinds.entry.EntryRollout` of the agent.
        generation_config: The model's generation config (its end ids end a turn, as in RL).
        prompt_column, completion_column: The columns of a demonstration's prompt and messages.
    """

    def __init__(self, processing_class: Any, entry: Any, generation_config: Any, prompt_column: str,
                 completion_column: str) -> None:
        config = entry.config
        self.encoder = ObservationEncoder(processing_class, "chat", config.observation_role,
                                          config.chat_template_kwargs)
        self.generator = _ScriptedTurns([], generation_config)
        eos = get_eos_token_ids(processing_class, generation_config)
        self.seam = entry.seam(processing_class, self.generator, eos, prompt_column)
        self.completion_column = completion_column

    def __call__(self, row: dict[str, Any]) -> list[Any]:
        """The training rows (one per segment) of one demonstration run through the agent."""
        turns = _turns(self.encoder, row[self.completion_column])
        self.generator.turns, self.generator.calls = turns, 0
        run = self.seam.run([{key: value for key, value in row.items() if key != self.completion_column}])[0][0]
        if run.refusal:
            raise DemonstrationError(f"the endpoint refused the agent's request: {run.refusal}")
        if run.env_failed:
            raise DemonstrationError(f"the agent failed during the demonstration: {run.error}")
        if self.generator.calls != len(turns):
            raise DemonstrationError(f"the agent made {self.generator.calls} model calls; the demonstration has "
                                     f"{len(turns)} assistant turns: write one per call the agent makes")
        return run.training_rows()

    def close(self) -> None:
        self.seam.close()
