"""The multi-turn rollout engine: one path for the trainers, evaluation and the demo.

For a batch of prompts the engine creates one environment per trajectory, then loops over turns::

    every active trajectory of this process, in ONE generation call
        -> keep the sampled ids up to the first end id / stop string / budget (mask 1)
    Environment.step(action) for all of them, concurrently, each under a timeout
        -> observation tokenized as untrusted text (text mode) or as a chat-message delta (chat mode) (mask 0)

Native tool calls (:mod:`trl_agentic.environments.native_tools`): for a :class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`
the prompt is rendered with its tools' schemas, each turn is parsed by the chat template's response template and
``step`` receives the assistant message; its tool messages come back as one chat-template delta.

The loop runs while *any* process still has an active trajectory (``sync_any``), so every rank makes the same
number of generation calls per step, which vLLM server mode, tensor-parallel colocate and DeepSpeed ZeRO-3 require.
A rank with nothing left to generate sends a one-token dummy prompt and discards the result.

Tools overlapped with generation (``overlap_chunks``): with one chunk a turn costs its generation *plus* its
slowest tool. With ``k`` chunks the active trajectories are split into ``k`` groups generated one after the other,
and each group's environment steps run (on the background loop) while the next groups generate, so that in steady
state a round costs about the larger of the two. ``"auto"`` (the default) runs the first turn as one chunk, and
splits into two when its tool calls took at least a quarter of its generation time (and 10 ms). Every process uses the same
number of chunks and makes the same generation calls (a chunk is skipped only when it is empty on every process).
Chunking changes the order in which sampling draws random numbers, and ``"auto"`` decides from measured time: set
``overlap_chunks`` to a number for runs that must sample bit-identically (tools that take under 10 ms never split).
Environments whose calls run on the rollout's thread (``runs_on_caller_thread``: TRL's tools, as TRL runs them) are
never split: their calls run between generations.

End ids: a turn ends at the first of the model's end ids (every id of ``generation_config.eos_token_id`` and the
tokenizer's EOS; in chat mode also the template's end-of-turn token); nothing after it is kept.

Failures cost one trajectory, never the batch or the run (:mod:`trl_agentic.rollout.env_calls`): an environment
whose factory, ``reset`` or ``step`` raises or returns an ill-typed value ends its trajectory with ``env_error``,
one that exceeds ``env_timeout`` with ``env_timeout``; an observation's content longer than
``max_observation_tokens`` is cut (counted as ``observation_truncated``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..environments.base import EnvironmentFactory, check_environment_factory, check_stop_strings
from ..environments.native_tools import native_tools, parse_turn, tool_schema_problem
from ..trajectory import StopReason, Trajectory
from .config import RolloutConfig
from .env_calls import EnvFailure, PendingCalls, call_all
from .generation import Generator, cut_at_stop, generation_session, get_eos_token_ids
from .observations import ObservationEncoder, is_conversational

logger = logging.getLogger(__name__)


AUTO_OVERLAP_RATIO = 0.25
AUTO_OVERLAP_MIN_SECONDS = 0.01
"""``overlap_chunks="auto"`` splits a rollout into two chunks when its first turn's tool calls took at least
``AUTO_OVERLAP_RATIO`` of its generation time and at least ``AUTO_OVERLAP_MIN_SECONDS`` (below that there is
nothing worth hiding)."""


@dataclass
class _Steps:
    """One chunk's environment steps under way: the trajectories, why their turns ended, the calls."""

    indices: list[int]
    ends: dict[int, str | None]
    calls: PendingCalls


class RolloutEngine:
    """Runs multi-turn episodes; see the module docstring.

    Args:
        generator: The generation seam (``HFGenerator``, TRL's vLLM backend, a fake).
        processing_class: The policy's tokenizer.
        environment: Class or zero-argument callable giving a fresh environment per trajectory.
        config: Budgets and protocol.
        sync_any: Given whether this process still has active trajectories, return whether *any* process has
            (identity on one process).
        sync_max: Given an integer of this process, return the largest over all processes (identity on one
            process); the number of chunks is agreed with it.
        eos_token_ids: Every id that ends the model's generation (:func:`~trl_agentic.rollout.generation.get_eos_token_ids`);
            by default read from the generator's ``generation_config`` and the tokenizer.
    """

    def __init__(
        self,
        generator: Generator,
        processing_class: Any,
        environment: EnvironmentFactory,
        config: RolloutConfig | None = None,
        sync_any: Callable[[bool], bool] | None = None,
        eos_token_ids: Sequence[int] | None = None,
        sync_max: Callable[[int], int] | None = None,
    ) -> None:
        check_environment_factory(environment)
        if config is not None and not isinstance(config, RolloutConfig):
            raise TypeError(f"config must be a RolloutConfig, got {type(config).__name__}")
        self.generator = generator
        self.config = config or RolloutConfig()
        if eos_token_ids is None:
            eos_token_ids = get_eos_token_ids(processing_class, getattr(generator, "generation_config", None))
        cfg = self.config
        self.encoder = ObservationEncoder(
            processing_class, cfg.rollout_mode, cfg.observation_role, cfg.chat_template_kwargs, eos_token_ids
        )
        self.tokenizer = self.encoder.tokenizer
        self.eos_token_ids = self.encoder.turn_end_ids(eos_token_ids)
        self.environment = environment
        self.sync_any = sync_any or (lambda local: local)
        self.sync_max = sync_max or (lambda local: local)
        self.generation_calls = 0  # per process; the multi-process invariant is checked against it

    # -- public ----------------------------------------------------------------------------------------------
    def run(self, prompts: Sequence[Any], rows: Sequence[dict[str, Any]] | None = None,
            environments: Sequence[Any] | None = None) -> list[Trajectory]:
        """Roll out one trajectory per prompt. ``rows[i]`` (the dataset row) is passed to ``reset``.
        ``environments`` (one per prompt) replaces the instances the engine would make with its factory, for a
        caller that reads them afterwards (TRL's reward functions take ``environments=``)."""
        rows = list(rows) if rows is not None else [{} for _ in prompts]
        if len(rows) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(rows)} rows")
        if environments is not None and len(environments) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(environments)} environments")
        envs = list(environments) if environments is not None else [self._make_environment() for _ in prompts]
        with generation_session(self.generator):  # one KV cache across the turns, dropped at the end
            return self._run(prompts, rows, envs)

    def _run(self, prompts: Sequence[Any], rows: list[dict[str, Any]], envs: list[Any]) -> list[Trajectory]:
        stop_strings = self._stop_strings(envs)
        trajectories, active = self._start(prompts, rows, envs)
        wanted = self.config.overlap_chunks
        if any(getattr(env, "runs_on_caller_thread", False) for env in envs):
            wanted = 1  # their calls run on this thread, between generations: nothing to overlap
        chunks = self._split(active, 1 if wanted == "auto" else self.sync_max(wanted))
        pending: list[_Steps | None] = [None] * len(chunks)
        first_round = True
        while self.sync_any(any(chunks) or any(p is not None for p in pending)):
            timing = {"generation": 0.0, "tools": 0.0}
            for j in range(len(chunks)):
                if pending[j] is not None:
                    chunks[j], pending[j] = self._finish_steps(trajectories, pending[j], timing), None
                if len(chunks) > 1 and not self.sync_any(bool(chunks[j])):
                    continue  # empty on every process
                started = time.perf_counter()
                ends = self._generate_turn(trajectories, chunks[j], stop_strings)
                timing["generation"] += time.perf_counter() - started
                pending[j] = self._begin_steps(trajectories, envs, chunks[j], ends)
                if len(chunks) == 1:  # nothing to overlap with: wait now
                    chunks[j], pending[j] = self._finish_steps(trajectories, pending[j], timing), None
            if first_round and wanted == "auto":
                chunks = self._split(chunks[0], self.sync_max(self._auto_chunks(timing, len(chunks[0]))))
                pending = [None] * len(chunks)
            first_round = False
        self._close(envs, trajectories)
        return trajectories

    @staticmethod
    def _split(indices: list[int], k: int) -> list[list[int]]:
        return [indices[j::k] for j in range(k)]

    @staticmethod
    def _auto_chunks(timing: dict[str, float], active: int) -> int:
        overlap_pays = timing["tools"] >= max(AUTO_OVERLAP_RATIO * timing["generation"], AUTO_OVERLAP_MIN_SECONDS)
        return 2 if overlap_pays and active >= 2 else 1

    # -- turn loop -------------------------------------------------------------------------------------------
    def _start(self, prompts, rows, envs) -> tuple[list[Trajectory], list[int]]:
        live = [i for i, env in enumerate(envs) if not isinstance(env, EnvFailure)]
        results: list[Any] = list(envs)
        for i, result in zip(live, call_all([envs[i] for i in live], "reset", [dict(rows[i]) for i in live],
                                            self.config.env_timeout)):
            results[i] = result
        trajectories, active = [], []
        for i, (prompt, result) in enumerate(zip(prompts, results)):
            tools = () if isinstance(result, EnvFailure) else native_tools(envs[i]) or ()  # after reset: per row
            undescribed = next((problem for problem in map(tool_schema_problem, tools) if problem), None)
            if undescribed is not None:  # the chat template could not render this trajectory's prompt
                result, tools = EnvFailure("env_error", f"{type(envs[i]).__name__}'s tools: {undescribed}"), ()
            failed = isinstance(result, EnvFailure)
            text = None if failed else result
            trajectory = Trajectory(prompt_ids=self.encoder.encode_prompt(prompt, text, tools))
            trajectory.prompt = with_reset_text(prompt, text)
            if failed:
                self._fail(trajectory, result)
            else:
                active.append(i)
            trajectories.append(trajectory)
        return trajectories, active

    def _generate_turn(self, trajectories: list[Trajectory], active: list[int], stop_strings: list[str]) -> dict[int, str | None]:
        """One generation call for every active trajectory; returns why each one's turn ended (``"eos"``,
        ``"stop"``, ``"max_tokens"`` when the trajectory's budget cut it, ``None`` at the per-turn budget)."""
        cfg = self.config
        max_new = cfg.max_tokens_per_turn
        if active:
            inputs = [trajectories[i].prompt_ids + trajectories[i].completion_ids for i in active]
        else:  # keep collective generation calls aligned across processes
            inputs = [trajectories[0].prompt_ids[:1] or [self.eos_token_ids[0]]]
        outputs = self.generator.generate(inputs, max_new, stop_strings, self.eos_token_ids)
        self.generation_calls += 1
        ends: dict[int, str | None] = {}
        for i, out in zip(active, outputs):
            t = trajectories[i]
            end, reason = cut_at_stop(out.ids, self._decode, stop_strings, self.eos_token_ids)
            budget = cfg.max_completion_length - len(t.completion_ids)
            if end > budget:
                end, reason = budget, "max_tokens"
            ids = out.ids[:end]
            start = len(t.completion_ids)
            t.generated_ids.append(list(out.ids))
            t.completion_ids.extend(ids)
            t.env_mask.extend([1] * len(ids))
            t.logprobs.extend(out.logprobs[:end] if out.logprobs is not None else [None] * len(ids))  # unknown, not 0
            t.turn_spans.append((start, start + len(ids)))
            t.actions.append(self._decode(ids))
            ends[i] = reason
        return ends

    def _begin_steps(self, trajectories, envs, active, ends) -> _Steps:
        """Start the environment steps of the trajectories whose turn did not exhaust the token budget."""
        stepping = []
        for i in active:
            if ends[i] == "max_tokens":
                self._action(trajectories[i], envs[i])  # native calls: the cut turn's message, as TRL parses it
                self._end(trajectories[i], "max_tokens")
            else:
                stepping.append(i)
        actions = [self._action(trajectories[i], envs[i]) for i in stepping]
        calls = PendingCalls([envs[i] for i in stepping], "step", actions, self.config.env_timeout)
        return _Steps(stepping, ends, calls)

    def _finish_steps(self, trajectories, steps: _Steps, timing: dict[str, float]) -> list[int]:
        """Apply the step results: record rewards and infos, end finished trajectories, append observations; returns
        the trajectories still active."""
        results = steps.calls.results()
        timing["tools"] += steps.calls.seconds
        still_active = []
        for i, result in zip(steps.indices, results):
            t = trajectories[i]
            if isinstance(result, EnvFailure):
                self._fail(t, result)
                continue
            t.turn_rewards.append(float(result.reward))
            t.turn_infos.append(dict(result.info))
            if result.terminated and self.config.rollout_mode == "chat" and steps.ends[i] is None:
                self._end(t, "max_tokens")  # a last message cut by the turn's budget: TRL counts it clipped
            elif result.terminated or result.truncated:
                self._end(t, "terminated" if result.terminated else "env_truncated")
            elif self.config.rollout_mode == "text" and steps.ends[i] == "eos":
                self._end(t, "eos")  # the model ended its text; the environment did not object
            elif t.num_turns >= self.config.max_turns:
                self._end(t, "max_turns")
            elif self._append_observation(t, result.observation):
                still_active.append(i)
        return still_active

    def _append_observation(self, t: Trajectory, text: str | list[dict[str, Any]] | None) -> bool:
        """Tokenize and append one observation; False (and ``max_tokens``) when the budget leaves no room."""
        cfg = self.config
        if text is None and cfg.rollout_mode == "text":
            t.observations.append(None)
            if len(t.completion_ids) >= cfg.max_completion_length:
                self._end(t, "max_tokens")
                return False
            return True
        start, end = t.turn_spans[-1]
        encoded = self.encoder.encode_observation(text or "", t.completion_ids[start:end], cfg.max_observation_tokens)
        if encoded.observation_truncated:
            t.count("observation_truncated")
        if len(t.completion_ids) + len(encoded.ids) >= cfg.max_completion_length:
            self._end(t, "max_tokens")
            return False
        t.observations.append(encoded.text)
        if isinstance(text, list):
            t.messages.extend(text)
        t.completion_ids.extend(encoded.ids)
        t.env_mask.extend([0] * len(encoded.ids))
        t.logprobs.extend([0.0] * len(encoded.ids))
        return True

    def _action(self, t: Trajectory, env: Any) -> str | dict[str, Any]:
        """What ``step`` receives: the turn's text, or, for an environment with native tools, the assistant message
        parsed by the chat template's response template (:func:`~trl_agentic.environments.native_tools.parse_turn`)."""
        tools = native_tools(env)
        if tools is None:
            return t.actions[-1]
        start, end = t.turn_spans[-1]
        message = parse_turn(self.tokenizer, t.completion_ids[start:end], t.prompt_ids + t.completion_ids[:start], tools)
        t.messages.append({k: v for k, v in message.items() if k != "malformed"})
        return message

    # -- environments ----------------------------------------------------------------------------------------
    def _make_environment(self) -> Any:
        try:
            return self.environment()
        except Exception as exc:  # a factory that raises costs its trajectory
            name = getattr(self.environment, "__name__", type(self.environment).__name__)
            logger.debug("environment factory %s raised %s: %s", name, type(exc).__name__, exc)  # named per round
            return EnvFailure("env_error", f"environment factory {name} raised {type(exc).__name__}: {exc}")

    def _close(self, envs: list[Any], trajectories: list[Trajectory]) -> None:
        live = [i for i, env in enumerate(envs) if not isinstance(env, EnvFailure)]
        for i, result in zip(live, call_all([envs[i] for i in live], "close", [None] * len(live), self.config.env_timeout)):
            if isinstance(result, EnvFailure):
                trajectories[i].count("env_close_error")

    @staticmethod
    def _end(t: Trajectory, reason: StopReason) -> None:
        if len(t.observations) < len(t.actions):
            t.observations.append(None)
        t.stop_reason = reason

    def _fail(self, t: Trajectory, failure: EnvFailure) -> None:
        if len(t.turn_rewards) < len(t.actions):  # the failed step of this turn
            t.turn_rewards.append(0.0)
            t.turn_infos.append({})
        self._end(t, failure.kind)
        t.error = failure.detail
        t.count(failure.kind)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _stop_strings(self, envs: list[Any]) -> list[str]:
        stop = list(self.config.stop_strings)
        for env in envs:  # one environment class per batch: read its declared stop strings once
            if not isinstance(env, EnvFailure):
                declared = check_stop_strings(getattr(env, "stop_strings", ()), f"{type(env).__name__}.stop_strings")
                stop += [s for s in declared if s not in stop]
                break
        return stop

    def _decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def with_reset_text(prompt: Any, text: str | None) -> Any:
    """The prompt with the text ``reset()`` returned appended (to the last message's content for chat prompts, as
    TRL 1.16 appends it); a new object, ``prompt`` is left as it was."""
    if not text:
        return prompt
    if not is_conversational(prompt):
        return prompt + text
    last = dict(prompt[-1])
    content = last.get("content")
    if isinstance(content, list):
        last["content"] = [*content, {"type": "text", "text": text}]
    else:
        last["content"] = (content or "") + text
    return [*prompt[:-1], last]
