"""Demonstrations -> :class:`~trl_agentic.Trajectory`, replayed through the rollout engine.

A demonstration is *replayed through the rollout engine* (:class:`~trl_agentic.rollout.engine.RolloutEngine`): a
scripted generator "samples" each action's ids (the action text tokenized as the model would sample it: no BOS; in
chat mode followed by the template's end-of-turn id), the engine cuts them at the stop strings and budgets as in RL,
and observations are appended by the engine's own :class:`~trl_agentic.rollout.observations.ObservationEncoder` (text
mode: untrusted text; chat mode: the chat template's message delta), so they are byte-identical to what RL appends. A
demonstration RL could not produce (an action that would be cut earlier, a turn over budget) is refused with a
:class:`DemonstrationError` that says why.

Demonstrations come as TRL's prompt-completion rows (``{"prompt", "completion"}``):

- text mode: ``completion`` is the text after the prompt, turns ended by the protocol's stop strings (``</search>``,
  ``</answer>``), each tool call followed by its observation block (``\\n\\n<information>...</information>\\n\\n``;
  whitespace around the block belongs to the observation), split by
  :meth:`~trl_agentic.environments.tag_protocol.TagProtocol.split_transcript`. With ``environment=`` the observations are left out
  and the environment computes them (the demonstration is replayed against the real tool).
- chat mode: ``completion`` is a list of messages: ``assistant`` messages are the actions, the message after each
  (role ``observation_role``) its observation. Or an OpenAI-style tool-calling trace (assistant messages with
  ``tool_calls``, then their ``tool`` messages; the row's ``tools`` column holds the schemas): replayed as native
  tool calls (:mod:`trl_agentic.sft.tool_traces`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..environments.base import EnvironmentFactory, StepResult, read_info
from ..environments.tag_protocol import SEARCH_R1_TAGS, TagProtocol
from ..rollout.config import RolloutConfig
from ..rollout.engine import RolloutEngine
from ..rollout.generation import Generation
from ..rollout.observations import ObservationEncoder
from ..trajectory import Trajectory
from .errors import DemonstrationError
from .tool_traces import ScriptedToolEnvironment, check_tool_results, is_tool_trace, rl_prompt, split_tool_messages

__all__ = ["DemonstrationError", "demonstration_to_trajectory", "transcript_to_trajectory"]


class _ScriptedGenerator:
    """The generation seam, replaying one demonstration's action ids (one trajectory per engine run)."""

    def __init__(self, turns: list[list[int]], generation_config: Any = None) -> None:
        self.turns = turns
        self.generation_config = generation_config  # the engine reads the model's end ids from it
        self.calls = 0

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str],
                 eos_token_ids: Sequence[int]) -> list[Generation]:
        if self.calls >= len(self.turns):
            raise DemonstrationError(
                f"the environment did not end the episode after the demonstration's last action (turn "
                f"{len(self.turns)}): it expected another turn; end the demonstration with an answer"
            )
        ids = self.turns[self.calls][:max_new_tokens]
        self.calls += 1
        return [Generation(ids=list(ids)) for _ in prompts]


class _ScriptedEnvironment:
    """Returns the demonstration's observations in order, and ends the episode after the last action."""

    def __init__(self, observations: Sequence[str | None], stop_strings: Sequence[str]) -> None:
        self.observations = list(observations)
        self.stop_strings = list(stop_strings)
        self.turn = 0

    def reset(self, **row: Any) -> None:
        self.turn = 0

    def step(self, action: str) -> StepResult:
        k, self.turn = self.turn, self.turn + 1
        if k < len(self.observations):
            return StepResult(observation=self.observations[k])
        return StepResult(terminated=True)


def _tokenizer(processing_class: Any) -> Any:
    return getattr(processing_class, "tokenizer", processing_class)


def demonstration_to_trajectory(
    processing_class: Any,
    prompt: Any,
    actions: Sequence[str],
    observations: Sequence[str] | None = None,
    *,
    environment: EnvironmentFactory | None = None,
    row: dict[str, Any] | None = None,
    protocol: TagProtocol | None = SEARCH_R1_TAGS,
    generation_config: Any = None,
    config: RolloutConfig | None = None,
    **config_kwargs: Any,
) -> Trajectory:
    """Replay a demonstration through the rollout engine and return its :class:`~trl_agentic.Trajectory`.

    Args:
        processing_class: The policy's tokenizer.
        prompt: The prompt as the trainers receive it (text, or chat messages).
        actions: The model's text of each turn. Text mode: tokenized as is (``add_special_tokens=False``); chat
            mode: the assistant message content, followed by the template's end-of-turn id (unless the content ends
            at a stop string: the engine stops there, as in RL).
        observations: The observation after each action but the last (``len(actions) - 1`` of them); ``None`` to
            have ``environment`` compute them.
        environment: Replay against this environment (class or factory): it receives ``row`` in ``reset`` and each
            action in ``step``, and must end the episode after the last action.
        row: The dataset row passed to ``reset`` (default ``{}``).
        protocol: With scripted observations, the stop strings that end a turn (``protocol.stop_strings``), as the
            environment that serves the protocol declares them; ``None`` for none.
        generation_config: The model's generation config (``model.generation_config``): its ``eos_token_id`` lists
            every id that ends a turn, as in RL (default: the tokenizer's EOS alone).
        config: A :class:`~trl_agentic.RolloutConfig` (use the one RL uses, so that budgets, ``rollout_mode``,
            ``observation_role`` and ``max_observation_tokens`` match), or its fields as keyword arguments.

    Raises:
        DemonstrationError: an action would be cut earlier or is over a budget, the environment or one of its tool
            calls failed or it did not end the episode, or the observations do not fit the actions.
    """
    config = RolloutConfig.from_arguments(config, config_kwargs)
    if not actions:
        raise DemonstrationError("a demonstration needs at least one action")
    if (observations is None) == (environment is None):
        raise DemonstrationError("pass either observations= (scripted) or environment= (replayed), exactly one")
    if observations is not None:
        if len(observations) != len(actions) - 1:
            raise DemonstrationError(f"{len(actions)} actions need {len(actions) - 1} observations (one after each "
                                     f"action but the last), got {len(observations)}")
        stop = protocol.stop_strings if protocol is not None else []
        scripted = list(observations)
        environment = lambda: _ScriptedEnvironment(scripted, stop)  # noqa: E731
    tokenizer = _tokenizer(processing_class)
    generator = _ScriptedGenerator([], generation_config)
    engine = RolloutEngine(generator, processing_class, environment, config)
    end_of_turn = [engine.encoder.layout.end_of_turn_id] if config.rollout_mode == "chat" else []
    generator.turns = [list(tokenizer(a, add_special_tokens=False)["input_ids"]) + end_of_turn for a in actions]
    trajectory = engine.run([prompt], [dict(row or {})])[0]
    _check_replay(trajectory, generator.turns, actions, config)
    return trajectory


def _check_replay(t: Trajectory, turns: list[list[int]], actions: Sequence[str], config: RolloutConfig) -> None:
    """The engine kept every action whole, no tool call failed, and the episode ended after the last one, by the
    environment. A tool that failed during the replay (it raised, timed out or returned no text: ``tool_error`` /
    ``tool_timeout`` in the turn's info) would put its error text into the demonstration.

    In chat mode an action whose content ends at a stop string is kept without its end-of-turn id, as in RL: the
    engine stops there, and the encoder adds the end-of-turn id with the observation (masked)."""
    if t.env_failed:
        raise DemonstrationError(f"the environment failed during the demonstration: {t.error}")
    for k, info in enumerate(map(read_info, t.turn_infos)):
        if info.tool_error or info.tool_timeout:
            observation = (t.observations[k] if k < len(t.observations) else None) or ""
            tools = " and ".join(info.tool or ["tool"])  # the names of the turn's calls
            raise DemonstrationError(
                f"the {tools} call of action {k} failed during the replay "
                f"({' '.join(observation.split())[:120]!r}); a demonstration would teach that error: fix the tool "
                "(or the action)"
            )
    for k, (kept, wanted) in enumerate(zip(t.agent_segments(), turns)):
        if kept != wanted and not (config.rollout_mode == "chat" and kept == wanted[:-1]):
            if len(wanted) > min(config.max_tokens_per_turn, config.max_completion_length):
                why = f"it has {len(wanted)} tokens, more than max_tokens_per_turn={config.max_tokens_per_turn}"
            else:
                why = (f"the engine ends the turn after {len(kept)} of its {len(wanted)} tokens (a stop string or an "
                       "end id inside it; end each action at its first closing tool or answer tag)")
            raise DemonstrationError(f"action {k} ({actions[k][:60]!r}...) cannot be sampled as one turn: {why}")
    if t.num_turns < len(turns) or t.stop_reason != "terminated":
        raise DemonstrationError(
            f"the episode ended with {t.stop_reason!r} after {t.num_turns} of {len(turns)} actions; raise the budget "
            f"(max_turns={config.max_turns}, max_completion_length={config.max_completion_length}) or shorten it"
        )

def _split_messages(messages: Sequence[dict[str, Any]], observation_role: str) -> tuple[list[str], list[str]]:
    actions: list[str] = []
    observations: list[str] = []
    for k, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str):
            raise DemonstrationError(f"message {k} has no text content (content={content!r})")
        expected = "assistant" if k % 2 == 0 else observation_role
        if role != expected:
            raise DemonstrationError(
                f"message {k} has role {role!r} where {expected!r} was expected: a chat completion alternates "
                f"assistant messages and observations (role observation_role={observation_role!r}), starting and "
                "ending with an assistant message"
            )
        (actions if k % 2 == 0 else observations).append(content)
    if len(observations) != len(actions) - 1:
        raise DemonstrationError("a chat completion must end with an assistant message")
    return actions, observations


def _replay_tool_trace(processing_class: Any, prompt: Any, messages: list[dict[str, Any]],
                       environment: EnvironmentFactory | None, row: dict[str, Any], tools: Sequence[Any] | None,
                       generation_config: Any, config: RolloutConfig) -> Trajectory:
    """A tool-calling trace replayed against ``environment`` (the prompt and tools RL shows, results checked) or, without
    one, against its own tool messages with ``tools`` (module docstring of :mod:`~trl_agentic.sft.tool_traces`)."""
    if config.rollout_mode != "chat":
        raise DemonstrationError("a tool-calling trace needs rollout_mode='chat'")
    encoder = ObservationEncoder(processing_class, "chat", config.observation_role, config.chat_template_kwargs)
    if environment is None:
        if not tools:
            raise DemonstrationError("a tool-calling trace needs the tools its prompt shows, as in RL: pass "
                                     "environment_factory= or tools= (what the trainer gets), or a 'tools' column")
        actions, results = split_tool_messages(encoder, prompt, messages, list(tools))
        scripted = lambda: ScriptedToolEnvironment(list(tools), results)  # noqa: E731
        return demonstration_to_trajectory(processing_class, prompt, actions, environment=scripted, row=row,
                                           protocol=None, generation_config=generation_config, config=config)
    shown, shown_tools = rl_prompt(environment, row, prompt, config.env_timeout)
    actions, results = split_tool_messages(encoder, shown, messages, shown_tools)
    trajectory = demonstration_to_trajectory(processing_class, prompt, actions, environment=environment, row=row,
                                             protocol=None, generation_config=generation_config, config=config)
    check_tool_results(trajectory, results)
    return trajectory


def transcript_to_trajectory(
    processing_class: Any,
    prompt: Any,
    completion: str | Sequence[dict[str, Any]],
    *,
    environment: EnvironmentFactory | None = None,
    row: dict[str, Any] | None = None,
    protocol: TagProtocol | None = SEARCH_R1_TAGS,
    generation_config: Any = None,
    config: RolloutConfig | None = None,
    tools: Sequence[Any] | None = None,
    **config_kwargs: Any,
) -> Trajectory:
    """A demonstration written as TRL's prompt-completion pair, as a :class:`~trl_agentic.Trajectory`.

    ``completion`` is text (``rollout_mode="text"``, split with
    :meth:`~trl_agentic.environments.tag_protocol.TagProtocol.split_transcript`) or a list of messages (``rollout_mode="chat"``:
    assistant messages alternating with observation messages). With ``environment=`` the
    observations are computed by replaying the actions against it (a text transcript then leaves them out);
    otherwise they are read from the transcript. See :func:`demonstration_to_trajectory` for the other arguments.

    An OpenAI-style tool-calling trace (assistant messages with ``tool_calls``, each followed by its ``tool``
    messages) is replayed as native tool calls (:mod:`trl_agentic.sft.tool_traces`): against ``environment`` (a
    factory of native-tool environments, e.g. TRL's environment class as :class:`~trl_agentic.environments.
    trl_environments.TRLEnvironments`), whose reset text and tools the prompt shows as in RL and whose results the
    trace's tool messages must match; without one, with ``tools`` (the JSON schemas or functions the prompt shows, a
    row's ``tools`` column) and the trace's tool messages as the results.
    """
    config = RolloutConfig.from_arguments(config, config_kwargs)

    if not isinstance(completion, str) and is_tool_trace(completion):
        return _replay_tool_trace(processing_class, prompt, list(completion), environment, dict(row or {}), tools,
                                  generation_config, config)
    if isinstance(completion, str):
        if config.rollout_mode != "text":
            raise DemonstrationError("a text completion needs rollout_mode='text'; pass chat messages for 'chat'")
        try:
            actions, observations = (protocol or SEARCH_R1_TAGS).split_transcript(completion)
        except ValueError as exc:
            raise DemonstrationError(str(exc)) from None
        given = [o for o in observations if o is not None]
        if environment is not None and given:
            raise DemonstrationError("with environment= the environment computes the observations: leave them out "
                                     "of the transcript, or pass environment=None to use them")
        if environment is None and len(given) != len(observations):
            raise DemonstrationError("the transcript has a tool call without an observation after it; write the "
                                     "observation block, or pass environment= to compute it")
    else:
        if config.rollout_mode != "chat":
            raise DemonstrationError("a message-list completion needs rollout_mode='chat'; pass text for 'text'")
        actions, observations = _split_messages(list(completion), config.observation_role)
        if environment is not None and observations:
            raise DemonstrationError("with environment= the environment computes the observations: pass only the "
                                     "assistant messages' turns without environment=, or the messages without it")
    return demonstration_to_trajectory(
        processing_class, prompt, actions, None if environment is not None else observations,
        environment=environment, row=row, protocol=protocol, generation_config=generation_config, config=config,
    )
