"""Agentic SFT: demonstrations and successful rollouts as supervised data, in the rollout engine's own token layout.

RL from outcome rewards cannot start when no sample of a group is ever right (every advantage is 0). ReTool
(arXiv 2504.11536) and DeepSeek-R1 (arXiv 2501.12948) start from a cold-start SFT stage on tool-using traces;
STaR (arXiv 2203.14465) and RFT (arXiv 2308.01825) fine-tune on the model's own samples that a verifier accepts.
This module does both with TRL's ``SFTTrainer`` and guarantees that what SFT trains is, token for token, what RL
later samples and trains:

- A demonstration is *replayed through the rollout engine* (:class:`~trl_agentic.RolloutEngine`): a scripted
  generator "samples" each action's ids (the action text tokenized as the model would sample it: no BOS; in chat
  mode followed by the template's end-of-turn id), the engine cuts them at the stop strings and budgets as in RL, and
  observations are appended by the engine's own :class:`~trl_agentic.rollout.observations.ObservationEncoder`
  (text mode: untrusted text; chat mode: the chat template's message delta), so they are byte-identical to what RL
  appends. A demonstration RL could not produce (an action that would be cut earlier, a turn over budget) is refused
  with a :class:`DemonstrationError` that says why.
- A :class:`~trl_agentic.Trajectory` (a demonstration, or a rollout from :func:`~trl_agentic.run_rollouts`) becomes
  one pre-tokenized ``SFTTrainer`` row: ``input_ids = prompt_ids + completion_ids``; ``completion_mask`` is 0 on the
  prompt, ``env_mask`` on the completion (1 on sampled tokens, 0 on observation tokens); ``labels`` are the ids where
  the mask is 1 and -100 elsewhere. ``SFTTrainer`` uses a ``labels`` column as is, so observation and prompt tokens
  carry no loss whatever ``completion_only_loss`` says. ``mask_observations=False`` trains on observation tokens too
  (Search-R1's ablation: it lowered EM from 0.431 to 0.343), with a warning, as ``AgenticGRPOConfig`` does.

Demonstrations come as TRL's prompt-completion rows (``{"prompt", "completion"}``):

- text mode: ``completion`` is the text after the prompt, turns ended by the protocol's stop strings (``</search>``,
  ``</answer>``), each tool call followed by its observation block (``\\n\\n<information>...</information>\\n\\n``;
  whitespace around the block belongs to the observation). With ``environment=`` the observations are left out and
  the environment computes them (the demonstration is replayed against the real tool).
- chat mode: ``completion`` is a list of messages: ``assistant`` messages are the actions, the message after each
  (role ``observation_role``) its observation. Or an OpenAI-style tool-calling trace (assistant messages with
  ``tool_calls``, then their ``tool`` messages; the row's ``tools`` column holds the schemas): replayed as native
  tool calls (:mod:`trl_agentic.native_tools`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable

from .environment import EnvironmentFactory, StepResult
from .native_tools import ToolCallEnvironment
from .rollout.engine import RolloutConfig, RolloutEngine
from .rollout.generation import Generation
from .rollout.observations import ObservationEncoder
from .tag_protocol import SEARCH_R1_TAGS, TagProtocol
from .trajectory import Trajectory

__all__ = [
    "DemonstrationError",
    "demonstration_to_trajectory",
    "split_transcript",
    "transcript_to_trajectory",
    "trajectory_to_sft_example",
    "sft_dataset",
    "rejection_sampling",
    "RejectionSample",
    "rft",
    "RFTRound",
]

UNMASKED_WARNING = (
    "mask_observations=False: observation tokens (tool output) are trained on, as in Search-R1's ablation, which "
    "lowered its results; keep the default unless you are reproducing it."
)


class DemonstrationError(ValueError):
    """A demonstration that the rollout engine could not have produced; the message says which turn and why."""


# -- Trajectory -> SFT row ---------------------------------------------------------------------------------------


def trajectory_to_sft_example(trajectory: Trajectory, mask_observations: bool = True) -> dict[str, list[int]]:
    """One pre-tokenized ``SFTTrainer`` row (see the module docstring): ``input_ids``, ``completion_mask`` and
    ``labels`` (-100 where the mask is 0).

    Raises:
        ValueError: the trajectory's environment failed, or it has no token to train.
    """
    if not mask_observations:
        warnings.warn(UNMASKED_WARNING, stacklevel=2)
    if trajectory.env_failed:
        raise ValueError(f"the trajectory's environment failed ({trajectory.stop_reason}: {trajectory.error}); "
                         "it carries nothing to imitate")
    if len(trajectory.env_mask) != len(trajectory.completion_ids):
        raise ValueError(f"env_mask has {len(trajectory.env_mask)} entries for {len(trajectory.completion_ids)} "
                         "completion ids")
    completion_mask = list(trajectory.env_mask) if mask_observations else [1] * len(trajectory.completion_ids)
    if not any(completion_mask):
        raise ValueError("the trajectory has no sampled token to train on")
    input_ids = list(trajectory.prompt_ids) + list(trajectory.completion_ids)
    mask = [0] * len(trajectory.prompt_ids) + completion_mask
    return {"input_ids": input_ids, "completion_mask": mask,
            "labels": [token if keep else -100 for token, keep in zip(input_ids, mask)]}


# -- demonstrations -> Trajectory --------------------------------------------------------------------------------


class _ScriptedGenerator:
    """The generation seam, replaying one demonstration's action ids (one trajectory per engine run)."""

    def __init__(self, turns: list[list[int]], generation_config: Any = None) -> None:
        self.turns = turns
        self.generation_config = generation_config  # the engine reads the model's end ids from it
        self.calls = 0

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str],
                 stop_token_ids: Sequence[int]) -> list[Generation]:
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


class _ScriptedToolEnvironment(ToolCallEnvironment):
    """Native tool calls: the prompt shows ``tools`` (JSON schemas or functions), and each assistant turn that calls
    tools is answered with the demonstration's tool messages; a turn without a call ends the episode."""

    def __init__(self, tools: Sequence[Any], results: Sequence[list[dict[str, Any]]]) -> None:
        super().__init__()
        self.tools = list(tools)
        self.results = list(results)
        self.turn = 0

    def reset(self, **row: Any) -> None:
        self.turn = 0

    async def step(self, message: dict[str, Any]) -> StepResult:
        k, self.turn = self.turn, self.turn + 1
        if k < len(self.results):
            return StepResult(observation=self.results[k], info={"tool_calls": len(message.get("tool_calls") or [])})
        return StepResult(terminated=True)


def _tokenizer(processing_class: Any) -> Any:
    return getattr(processing_class, "tokenizer", processing_class)


def _make_config(config: RolloutConfig | None, config_kwargs: dict[str, Any]) -> RolloutConfig:
    if config is not None and config_kwargs:
        raise TypeError("pass either config= or RolloutConfig fields as keyword arguments, not both")
    return config if config is not None else RolloutConfig(**config_kwargs)


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
        DemonstrationError: an action would be cut earlier or is over a budget, the environment failed or did not
            end the episode, or the observations do not fit the actions.
    """
    config = _make_config(config, config_kwargs)
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
    """The engine kept every action whole, and the episode ended after the last one, by the environment.

    In chat mode an action whose content ends at a stop string is kept without its end-of-turn id, as in RL: the
    engine stops there, and the encoder adds the end-of-turn id with the observation (masked)."""
    if t.env_failed:
        raise DemonstrationError(f"the environment failed during the demonstration: {t.error}")
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


def split_transcript(text: str, protocol: TagProtocol = SEARCH_R1_TAGS) -> tuple[list[str], list[str | None]]:
    """Split a text-mode transcript (everything after the prompt) into actions and the observations after them.

    An action ends at the first of the protocol's stop strings (``</search>``, ``</answer>``); after a tool call
    comes its observation block (``<information>...</information>``, with the whitespace around it), or nothing (the
    next action starts at once: the observation is ``None``, to be computed by an environment). The final action
    may end at ``</answer>`` or at the end of the text.

    Returns:
        ``(actions, observations)`` with ``len(observations) == len(actions) - 1``.

    Raises:
        DemonstrationError: text after the final answer, or an observation block of the wrong tag.
    """
    stops = re.compile("|".join(re.escape(s) for s in protocol.stop_strings))
    answer_close = f"</{protocol.answer}>"
    actions: list[str] = []
    observations: list[str | None] = []
    position = 0
    while position < len(text):
        match = stops.search(text, position)
        if match is None:  # a last action without a closing tag
            actions.append(text[position:])
            break
        actions.append(text[position : match.end()])
        position = match.end()
        if match.group(0) == answer_close:
            if text[position:].strip():
                raise DemonstrationError(f"text after the final {answer_close}: {text[position:position + 60]!r}")
            break
        if not text[position:].strip():
            break
        tag = protocol.tools[match.group(0)[2:-1]]
        block = re.compile(rf"\s*<{re.escape(tag)}>.*?</{re.escape(tag)}>\s*", re.DOTALL).match(text, position)
        if block is None and re.match(r"\s*<(?:" + "|".join(map(re.escape, protocol.observation_tags)) + ")>",
                                      text[position:]):
            raise DemonstrationError(f"after {match.group(0)} the observation must be <{tag}>...</{tag}>: "
                                     f"{text[position:position + 60]!r}")
        observations.append(block.group(0) if block else None)
        position = block.end() if block else position
    if len(observations) == len(actions):  # the transcript ended on a tool call's observation
        raise DemonstrationError("the transcript ends with an observation; end it with the model's final action")
    return actions, observations


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


def _split_tool_messages(encoder: ObservationEncoder, prompt: Sequence[dict[str, Any]],
                         messages: Sequence[dict[str, Any]], tools: Sequence[Any]) -> tuple[list[str], list[list[dict]]]:
    """An OpenAI-style trace (assistant messages with ``tool_calls``, each followed by its ``tool`` messages) as the
    text the model samples in each turn (the assistant message as the chat template writes it, up to its end of
    turn) and the tool messages after each turn."""
    actions: list[str] = []
    results: list[list[dict[str, Any]]] = []
    end = encoder.tokenizer.convert_ids_to_tokens(encoder.layout.end_of_turn_id)
    history = [dict(m) for m in prompt]
    for k, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if not results or not actions:
                raise DemonstrationError(f"message {k}: a tool message must follow an assistant message that calls tools")
            results[-1].append(dict(message))
        elif role == "assistant":
            if results and not results[-1]:
                raise DemonstrationError(f"message {k}: the assistant message before it called tools but got no tool "
                                         "message back")
            before = encoder.render_text(history, add_generation_prompt=True, tools=tools)
            after = encoder.render_text(history + [dict(message)], add_generation_prompt=False, tools=tools)
            if not after.startswith(before) or end not in after[len(before):]:
                raise DemonstrationError(f"message {k}: the chat template does not render this assistant message as "
                                         "a continuation of the conversation")
            delta = after[len(before):]
            actions.append(delta[: delta.rindex(end)])
            results.append([])
        else:
            raise DemonstrationError(f"message {k} has role {role!r}; a tool-calling trace has assistant and tool "
                                     "messages after the prompt")
        history.append(dict(message))
    if not actions or messages[-1].get("role") != "assistant" or messages[-1].get("tool_calls"):
        raise DemonstrationError("a tool-calling trace must end with an assistant message that calls no tool")
    return actions, results[:-1]


def _is_tool_trace(messages: Sequence[dict[str, Any]]) -> bool:
    return any(isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls") for m in messages)


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

    ``completion`` is text (``rollout_mode="text"``, split with :func:`split_transcript`) or a list of messages
    (``rollout_mode="chat"``: assistant messages alternating with observation messages). With ``environment=`` the
    observations are computed by replaying the actions against it (a text transcript then leaves them out);
    otherwise they are read from the transcript. See :func:`demonstration_to_trajectory` for the other arguments.

    An OpenAI-style tool-calling trace (assistant messages with ``tool_calls``, each followed by its ``tool``
    messages; ``tools``: the JSON schemas or functions the prompt shows, TRL's ``tools`` column) is replayed as
    native tool calls: each assistant message as the chat template writes it is the sampled turn, parsed back by
    the template's response template, and its tool messages are rendered after it as in RL.
    """
    config = _make_config(config, config_kwargs)
    if not isinstance(completion, str) and _is_tool_trace(completion):
        if config.rollout_mode != "chat" or environment is not None:
            raise DemonstrationError("a tool-calling trace needs rollout_mode='chat' and no environment= (its tool "
                                     "messages are the observations)")
        encoder = ObservationEncoder(processing_class, "chat", config.observation_role, config.chat_template_kwargs)
        actions, results = _split_tool_messages(encoder, prompt, list(completion), list(tools or []))
        scripted = lambda: _ScriptedToolEnvironment(list(tools or []), results)  # noqa: E731
        return demonstration_to_trajectory(processing_class, prompt, actions, environment=scripted, row=row,
                                           protocol=None, generation_config=generation_config, config=config)
    if isinstance(completion, str):
        if config.rollout_mode != "text":
            raise DemonstrationError("a text completion needs rollout_mode='text'; pass chat messages for 'chat'")
        actions, observations = split_transcript(completion, protocol or SEARCH_R1_TAGS)
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


# -- datasets ----------------------------------------------------------------------------------------------------


def sft_dataset(
    examples: Iterable[Trajectory | dict[str, Any]],
    processing_class: Any = None,
    *,
    mask_observations: bool = True,
    environment: EnvironmentFactory | None = None,
    protocol: TagProtocol | None = SEARCH_R1_TAGS,
    generation_config: Any = None,
    config: RolloutConfig | None = None,
    prompt_column: str = "prompt",
    completion_column: str = "completion",
    show_progress: bool = True,
    **config_kwargs: Any,
) -> Any:
    """A ``datasets.Dataset`` of pre-tokenized rows (``input_ids``, ``completion_mask``, ``labels``) for TRL's
    ``SFTTrainer``.

    Args:
        examples: :class:`~trl_agentic.Trajectory` objects (e.g. the successful rollouts of
            :func:`rejection_sampling`), and/or prompt-completion rows (``{"prompt", "completion", ...}``; the whole
            row reaches the environment's ``reset``), converted by :func:`transcript_to_trajectory`.
        processing_class: The policy's tokenizer (needed for prompt-completion rows).
        mask_observations: Keep observation tokens out of the loss (default); ``False`` trains on them (warns).
        environment, protocol, generation_config, config: For prompt-completion rows, as in
            :func:`transcript_to_trajectory`.
        show_progress: A progress bar over the examples.

    An example that cannot be converted (a bad demonstration, a failed trajectory) is skipped; a warning gives the
    count and the first reason. Raises ``ValueError`` when nothing is left.
    """
    from datasets import Dataset

    config = _make_config(config, config_kwargs)
    if not mask_observations:
        warnings.warn(UNMASKED_WARNING, stacklevel=2)
    items = list(examples)
    if show_progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="building SFT rows", unit="example")
    rows, skipped = [], []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="mask_observations=False")
        for k, example in enumerate(items):
            try:
                if not isinstance(example, Trajectory):
                    example = _row_to_trajectory(example, processing_class, environment, protocol,
                                                 generation_config, config, prompt_column, completion_column)
                rows.append(trajectory_to_sft_example(example, mask_observations))
            except (ValueError, KeyError, TypeError) as exc:
                skipped.append(f"example {k}: {exc}")
    if skipped:
        warnings.warn(f"sft_dataset skipped {len(skipped)} of {len(rows) + len(skipped)} examples; first: "
                      f"{skipped[0]}", stacklevel=2)
    if not rows:
        raise ValueError("sft_dataset: no example could be converted" + (f" ({skipped[0]})" if skipped else ""))
    return Dataset.from_list(rows)


def _row_to_trajectory(row, processing_class, environment, protocol, generation_config, config, prompt_column,
                       completion_column):
    if not isinstance(row, dict):
        raise TypeError(f"an example must be a Trajectory or a prompt-completion dict, not {type(row).__name__}")
    if processing_class is None:
        raise TypeError("prompt-completion rows need processing_class= (the policy's tokenizer)")
    return transcript_to_trajectory(processing_class, row[prompt_column], row[completion_column],
                                    environment=environment, row=row, protocol=protocol,
                                    generation_config=generation_config, config=config, tools=row.get("tools"))


# -- rejection sampling (RFT / STaR) -----------------------------------------------------------------------------


@dataclass
class RejectionSample:
    """What :func:`rejection_sampling` kept.

    Attributes:
        trajectories: The accepted trajectories (at most ``max_per_row`` distinct ones per row), row-major.
        rows: The dataset row of each accepted trajectory.
        report: The :class:`~trl_agentic.evaluate.EvaluationReport` of all samples (``accuracy``: acceptance rate).
    """

    trajectories: list[Trajectory]
    rows: list[dict[str, Any]]
    report: Any


def rejection_sampling(
    model: Any,
    processing_class: Any,
    environment: EnvironmentFactory,
    rows: Sequence[dict[str, Any]],
    reward_func: Callable[..., Sequence[float | None]],
    *,
    samples_per_row: int = 4,
    threshold: float = 1.0,
    max_per_row: int | None = 1,
    batch_size: int = 32,
    prompt_column: str = "prompt",
    config: RolloutConfig | None = None,
    generation_config: Any = None,
    generator: Any = None,
    show_progress: bool = True,
    **config_kwargs: Any,
) -> RejectionSample:
    """Sample ``samples_per_row`` trajectories per row with the engine the trainers use, score them with a TRL reward
    function, and keep those whose reward is at least ``threshold`` (RFT, Yuan et al. 2023, arXiv 2308.01825; STaR's
    filter, Zelikman et al. 2022, arXiv 2203.14465). Trajectories whose environment failed are never kept; identical
    completions of one row are kept once; at most ``max_per_row`` per row (``None``: all).

    Sampling uses the model's generation config with ``do_sample=True`` (pass ``generation_config=`` to set the
    temperature). See :func:`~trl_agentic.evaluate.evaluate` for the other arguments.
    """
    from .evaluate import evaluate

    report, trajectories = evaluate(
        model, processing_class, environment, rows, reward_func, samples_per_row=samples_per_row,
        success_threshold=threshold, greedy=False, batch_size=batch_size, prompt_column=prompt_column,
        config=config, generator=generator, generation_config=generation_config, show_progress=show_progress,
        **config_kwargs,
    )
    kept, kept_rows = [], []
    for i, row in enumerate(rows):
        seen: set[tuple[int, ...]] = set()
        for j in range(i * samples_per_row, (i + 1) * samples_per_row):
            t, reward = trajectories[j], report.rewards[j]
            key = tuple(t.completion_ids)
            if reward is None or reward < threshold or t.env_failed or key in seen:
                continue
            if max_per_row is not None and len(seen) >= max_per_row:
                break
            seen.add(key)
            kept.append(t)
            kept_rows.append(dict(row))
    return RejectionSample(kept, kept_rows, report)


@dataclass
class RFTRound:
    """One round of :func:`rft`: the sampling report, how many trajectories were kept, and the SFT train loss
    (``None`` when nothing was kept and the round trained nothing)."""

    report: Any
    num_kept: int
    train_loss: float | None


def rft(
    model: Any,
    processing_class: Any,
    environment: EnvironmentFactory,
    rows: Sequence[dict[str, Any]],
    reward_func: Callable[..., Sequence[float | None]],
    sft_args: Any,
    *,
    rounds: int = 1,
    samples_per_row: int = 4,
    threshold: float = 1.0,
    max_per_row: int | None = 1,
    mask_observations: bool = True,
    peft_config: Any = None,
    batch_size: int = 32,
    config: RolloutConfig | None = None,
    generation_config: Any = None,
    show_progress: bool = True,
    **config_kwargs: Any,
) -> tuple[Any, list[RFTRound]]:
    """Rejection-sampling fine-tuning: ``rounds`` times, sample with :func:`rejection_sampling`, then fine-tune on
    the accepted trajectories with TRL's ``SFTTrainer`` (``sft_args``: an ``SFTConfig``; round ``r`` writes to
    ``<output_dir>/round-<r>``). Each round continues from the previous round's model (expert iteration; STaR
    restarts from the base model instead, which ``rounds=1`` per call reproduces).

    Args:
        model: The policy (a ``PreTrainedModel`` or a ``PeftModel``).
        peft_config: A PEFT config to wrap ``model`` in before the first round (ignored for a ``PeftModel``).
        mask_observations: As in :func:`sft_dataset`.
        Others: as in :func:`rejection_sampling`.

    Returns:
        The trained model and one :class:`RFTRound` per round.
    """
    from trl import SFTTrainer

    config = _make_config(config, config_kwargs)
    history: list[RFTRound] = []
    progress = range(rounds)
    if show_progress:
        from tqdm.auto import tqdm

        progress = tqdm(progress, desc="RFT rounds", unit="round")
    for r in progress:
        model.eval()
        sample = rejection_sampling(
            model, processing_class, environment, rows, reward_func, samples_per_row=samples_per_row,
            threshold=threshold, max_per_row=max_per_row, batch_size=batch_size, config=config,
            generation_config=generation_config, show_progress=show_progress,
        )
        if not sample.trajectories:
            history.append(RFTRound(sample.report, 0, None))
            continue
        dataset = sft_dataset(sample.trajectories, mask_observations=mask_observations, show_progress=False)
        is_peft = hasattr(model, "peft_config")
        trainer = SFTTrainer(
            model=model, args=replace(sft_args, output_dir=f"{sft_args.output_dir}/round-{r}"),
            train_dataset=dataset, processing_class=processing_class,
            peft_config=None if is_peft else peft_config,
        )
        result = trainer.train()
        model = trainer.model
        history.append(RFTRound(sample.report, len(sample.trajectories), float(result.training_loss)))
    return model, history
