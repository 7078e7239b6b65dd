"""One trajectory's record of an agent's requests: token-exact, with prefix reuse and segments.

Each trajectory (one agent run on one dataset row) has a :class:`Session`, reached through its own key. The session
holds one or more *segments*; a segment is one training sequence: prompt ids, then the model's sampled turns (mask 1)
interleaved with the messages the agent added between them (mask 0), exactly as the engine records a chat rollout.

A request **extends** a segment when the segment is idle, the request offers the same tools, its first messages stand
for everything the segment holds (:func:`~trl_agentic.agents.protocol.same_message`: what was sent, and each reply as
it was returned) and what follows them holds no assistant message. Then the recorded ids are reused as they are and
only the new messages' chat-template delta is appended, masked, with every content as untrusted text
(:meth:`ObservationEncoder.encode_observation`, the engine's encoder, probed once per sequence of roles). The model
continues from exactly those ids, and the ids it samples are kept as sampled: nothing is re-tokenized.

Any other request (a rewritten or summarised history, a dropped turn, a sub-agent's own conversation, other tools, or
a delta the template cannot render as a suffix) **starts a new segment**: its messages rendered whole
(:func:`~trl_agentic.agents.prompt.encode_conversation`) become that segment's prompt. Later requests extend whichever
segment they continue (the longest match), so a main agent and a sub-agent each grow their own. Every segment becomes
its own training row, sharing the trajectory's reward (:func:`trl_agentic.trainers.round.training_rows`).

Auxiliary calls (:mod:`~trl_agentic.agents.auxiliary`: a title, a summary, a quota check a CLI makes beside its task)
are recorded in segments of their own, which requests of the task never extend (nor they the task's); they are kept
out of training (``auxiliary``) unless ``train_auxiliary``, and counted.

Whose requests: a request that starts a segment must come with proof that the trajectory's own agent sent it, except
the first conversation of an agent that builds its own client and later ones that open as it did
(:meth:`Session._may_start`, :mod:`~trl_agentic.agents.ownership`); any other is refused (409 ``unproven_sender``) and
recorded nowhere. Length: a request that leaves the model no position to generate in answers 400
``context_length_exceeded`` naming both numbers (:mod:`~trl_agentic.agents.context`), and a turn never samples past the
model's last position.

Budgets hold across requests: ``max_turns`` counts model calls of the whole trajectory, ``max_completion_length``
bounds each segment (its sampled and added tokens), ``max_tokens_per_turn`` (and the request's ``max_tokens``) one
turn. A request over budget is answered at once with an empty ``finish_reason: "length"`` and the trajectory is
marked truncated (``max_turns`` / ``max_tokens``); every later request of a truncated trajectory is answered so too.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from ..environments.native_tools import ensure_response_parser, parse_turn
from ..rollout.config import RolloutConfig
from ..rollout.generation import Generation, cut_at_stop
from ..rollout.observations import EncodedObservation, ObservationEncoder
from ..trajectory import Trajectory
from .context import ContextLimit
from .forcing import CallOpenings
from .ownership import UNPROVEN, new_caller_id
from .prompt import encode_conversation
from .protocol import NAME, ChatRequest, Reply, RequestError, same_message


@dataclass
class AgentTrajectory(Trajectory):
    """The trajectory of one agent run: the fields of :class:`~trl_agentic.Trajectory` are those of its *main*
    segment (the one of its last model call, where its final answer normally is), plus:

    Attributes:
        segments: Every segment (training sequence) of the run, in the order they started; the main one included.
        auxiliary: The segments of its auxiliary calls (:mod:`~trl_agentic.agents.auxiliary`), not trained (with
            ``Agent(train_auxiliary=True)`` they are among ``segments`` instead).
        agent_output: What the agent returned (reward functions receive it as ``agent_output``).
        requests: Chat-completion requests the agent sent.
        refusal: The endpoint's message for the first request it refused (400 or 413), else ``None``.
    """

    segments: list[Trajectory] = field(default_factory=list)
    auxiliary: list[Trajectory] = field(default_factory=list)
    agent_output: Any = None
    requests: int = 0
    refusal: str | None = None

    def training_rows(self) -> list[Trajectory]:
        """Its segments, one training sequence each (itself, one masked token, when it never called the model)."""
        return self.segments or [self]

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["segments"] = [segment.to_dict() for segment in self.segments]
        data["auxiliary"] = [segment.to_dict() for segment in self.auxiliary]
        return data


@dataclass
class Segment:
    """One training sequence being recorded, and the messages its ids stand for."""

    trajectory: Trajectory
    history: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    busy: bool = False
    used: int = 0
    text: str | None = None  # a legacy completions segment: the text the agent was given so far
    auxiliary: str | None = None  # the kind of auxiliary call it records (None: the task's conversation)


@dataclass
class Turn:
    """A model call a request asked for: the ids to continue (the forced opening of a call last, if any) and its
    budget."""

    segment: Segment
    prompt_ids: list[int]
    max_new_tokens: int
    stop: list[str]
    last_of_budget: bool
    request: ChatRequest
    forced: list[int] = field(default_factory=list)


@dataclass
class Placement:
    """Where a request goes, before anything is recorded: the segment it extends with ``ids`` (masked), or, when
    ``segment`` is ``None``, a new segment whose prompt is ``ids``.

    Attributes:
        messages: Chat: the messages the ids stand for (the new ones, or the whole conversation).
        tools: Chat, a new segment: the tools it was offered.
        prompt: Legacy completions: the whole prompt text.
        text: What the appended ids stand for (kept in ``observations``).
    """

    segment: Segment | None
    ids: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    prompt: str | None = None
    text: str = ""
    observation_truncated: bool = False
    template_fallback: bool = False
    text_join_mismatch: bool = False


class Session:
    """The record of one trajectory (module docstring). Thread-safe: requests arrive on the server's thread, the
    agent's end on the agents' thread.

    Args:
        key: The trajectory's secret key.
        encoder: The engine's encoder in chat mode (control tokens, chat-template deltas).
        config: Budgets (``max_turns``, ``max_tokens_per_turn``, ``max_completion_length``, ``max_observation_tokens``,
            ``stop_strings``).
        eos_token_ids: Every id that ends a turn.
        max_prompt_tokens: Longest prompt of a new segment (a longer one answers 400 ``context_length_exceeded``);
            ``None``: no cap of its own.
        openings: The openings of calls under ``tool_choice="required"`` or a named function
            (:mod:`~trl_agentic.agents.forcing`); ``None``: serve those choices unforced.
        context: The longest sequence the model takes (:mod:`~trl_agentic.agents.context`): a request that leaves it
            no position to generate answers 400 ``context_length_exceeded``, and no turn samples past it.
        proves_sender: The agent's own requests carry proof of their sender (it was handed a client,
            :mod:`~trl_agentic.agents.ownership`): a request without that proof may continue a segment, never start
            one. ``False`` (an agent that builds its own client): the first conversation binds the key.
        train_auxiliary: Train the segments of auxiliary calls (training rows of their own); ``False`` keeps them in
            :attr:`AgentTrajectory.auxiliary`, untrained.
    """

    def __init__(self, key: str, encoder: ObservationEncoder, config: RolloutConfig, eos_token_ids: list[int],
                 max_prompt_tokens: int | None = None, openings: CallOpenings | None = None,
                 context: ContextLimit | None = None, proves_sender: bool = False,
                 train_auxiliary: bool = False) -> None:
        self.key, self.encoder, self.config = key, encoder, config
        self.proves_sender = proves_sender
        self.train_auxiliary = train_auxiliary
        self.caller_id = new_caller_id()
        self.tokenizer = encoder.tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_prompt_tokens = max_prompt_tokens
        self.context = context
        self._bos = list(self.tokenizer("", add_special_tokens=True)["input_ids"])  # a legacy prompt's start
        self.openings = openings
        self.segments: list[Segment] = []
        self.turns = self.requests = self.in_flight = 0
        self.closed = False
        self.truncation: str | None = None
        self.failure: tuple[str, str] | None = None  # (stop reason, error)
        self.refusal: str | None = None  # the message of the first request refused
        self.events: Counter = Counter()
        self._conversations: dict[str, list[dict[str, Any]]] = {}  # by the response ids given (Responses API)
        self.idle_since = time.monotonic()
        self._clock = 0
        self._lock = threading.Lock()

    # -- requests --------------------------------------------------------------------------------------------
    def begin(self, request: ChatRequest, proven: bool = False) -> Turn | Reply:
        """Place a request: a :class:`Turn` to generate, or, over budget, the :class:`Reply` to answer at once.
        ``proven``: the request came with proof that this trajectory's agent sent it
        (:mod:`~trl_agentic.agents.ownership`); a request without it that does not continue a segment is refused
        (409 ``unproven_sender``) unless :meth:`_may_start` allows it."""
        with self._lock:
            self._check_open()
            placement = self._place_text(request) if request.prompt is not None else self._place_chat(request)
            if placement.segment is None and not proven and not self._may_start(request):
                raise RequestError(409, UNPROVEN, code="unproven_sender")  # never recorded, never counted here
            self.requests += 1
            if request.auxiliary is not None:
                self.events["auxiliary"] += 1
            cfg = self.config
            if self.truncation is not None or self.turns >= cfg.max_turns:
                return self._over_budget(self.truncation or "max_turns")
            if placement.segment is None and request.prompt is None:
                placement.ids = self._conversation_ids(request)
            forced = self.openings.ids(request.tools, request.forced_call) \
                if request.forced_call is not None and self.openings is not None else None
            room = self._room(placement, forced or [], "prompt" if request.prompt is not None else "messages")
            segment = self._record(placement, request.auxiliary)
            if segment is None:
                return self._over_budget("max_tokens")
            if request.forced_call is not None and self.openings is not None:
                self.events["forced_call" if forced else "tool_choice_unforced"] += 1
            forced = forced or []
            t = segment.trajectory
            remaining = cfg.max_completion_length - len(t.completion_ids) - len(forced)
            if remaining <= 0:
                return self._over_budget("max_tokens")
            max_new = min(cfg.max_tokens_per_turn, remaining, request.max_tokens or remaining, room)
            segment.busy = True
            self._clock += 1
            segment.used = self._clock
            self.turns += 1
            self.in_flight += 1
            stop = list(dict.fromkeys([*request.stop, *cfg.stop_strings]))
            return Turn(segment, t.prompt_ids + t.completion_ids + forced, max_new, stop,
                        max_new in (remaining, room), request, forced)

    def prompt_tokens(self, request: ChatRequest) -> int:
        """How many tokens the request's conversation is, rendered whole (Anthropic's ``count_tokens``); nothing is
        recorded."""
        with self._lock:
            self._check_open()
            return len(self._conversation_ids(request))

    def finish(self, turn: Turn, generation: Generation) -> Reply:
        """Record what the model sampled for ``turn`` (kept up to the first end id, stop string or budget) and the
        reply, parsed by the chat template's response template when the request offered tools."""
        with self._lock:
            self.in_flight -= 1
            self.idle_since = time.monotonic()
            segment = turn.segment
            segment.busy = False
            self._check_open()
            t = segment.trajectory
            end, reason = cut_at_stop(generation.ids, self._decode, turn.stop, self.eos_token_ids)
            if end > turn.max_new_tokens:
                end, reason = turn.max_new_tokens, None
            ids = list(generation.ids[:end])
            logprobs = list(generation.logprobs[:end]) if generation.logprobs is not None else None
            opened = len(t.completion_ids)  # the turn: the forced opening of a call (masked), then what was sampled
            t.completion_ids.extend(turn.forced)
            t.env_mask.extend([0] * len(turn.forced))
            t.logprobs.extend([0.0] * len(turn.forced))
            start = len(t.completion_ids)
            t.generated_ids.append(list(generation.ids))
            t.completion_ids.extend(ids)
            t.env_mask.extend([1] * len(ids))
            t.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
            t.turn_spans.append((start, start + len(ids)))
            t.actions.append(self._decode(turn.forced + ids))
            if reason is None and turn.last_of_budget and end == turn.max_new_tokens and segment.auxiliary is None:
                self._truncate("max_tokens")  # an auxiliary call's budget is its own, not the task's
            message = self._message(turn, turn.forced + ids, t.prompt_ids + t.completion_ids[:opened],
                                    reason == "stop")
            if segment.text is not None:
                segment.text += message["content"]
            segment.history.append(message)
            t.messages.append(message)
            t.turn_infos.append({"tool": [call["function"]["name"] for call in message.get("tool_calls", [])]})
            finish = "length" if reason is None else ("tool_calls" if message.get("tool_calls") else "stop")
            tokens = [self.tokenizer.decode([i]) for i in ids] if turn.request.logprobs else []
            return Reply(message["content"], message.get("tool_calls", []), finish, ids, logprobs, tokens,
                         len(turn.prompt_ids))

    def abandon(self, turn: Turn) -> None:
        """A turn whose generation will not be recorded (the rollout is stopping)."""
        with self._lock:
            self.in_flight -= 1
            turn.segment.busy = False

    def remember(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        """Keep the conversation a response given to this trajectory ends (its ``previous_response_id``)."""
        with self._lock:
            self._conversations[response_id] = conversation

    def recall(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation of a response given to this trajectory, ``None`` for any other id."""
        with self._lock:
            return self._conversations.get(response_id)

    def refuse(self, message: str) -> None:
        """A request was refused (400 or 413) with ``message``: counted as ``bad_request``, the first message kept."""
        with self._lock:
            self.events["bad_request"] += 1
            self.refusal = self.refusal or message

    def excuse(self, seconds: float) -> None:
        """Do not count ``seconds`` as idle (the agents' loop was blocked by another agent meanwhile)."""
        if seconds > 0:
            with self._lock:
                self.idle_since += seconds

    def idle_seconds(self) -> float:
        """Seconds since the agent last got an answer (0 while one of its requests is being served); read without the
        lock (the watchdog polls every session: a stale read only delays a timeout by one tick)."""
        return 0.0 if self.in_flight else time.monotonic() - self.idle_since

    # -- end -------------------------------------------------------------------------------------------------
    def close(self, failure: tuple[str, str] | None = None) -> bool:
        """End the trajectory (later requests answer 409); ``failure`` is ``(stop_reason, error)`` for an agent that
        raised (``env_error``) or hung (``env_timeout``). Returns whether this call closed it."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            if failure is not None:
                self.failure = failure
                self.events[failure[0]] += 1
            return True

    def fail(self, failure: tuple[str, str]) -> bool:
        """End the trajectory as failed, even after its agent returned (a verdict on the whole round,
        :func:`~trl_agentic.agents.ownership.judge_round`), unless it has already failed. Returns whether it did."""
        with self._lock:
            self.closed = True
            if self.failure is not None:
                return False
            self.failure = failure
            self.events[failure[0]] += 1
            return True

    def trajectory(self, agent_output: Any = None) -> AgentTrajectory:
        """The run as an :class:`AgentTrajectory` (call after :meth:`close`). Every segment gets the trajectory's stop
        reason: ``env_error`` / ``env_timeout`` when the agent failed, else the budget that ran out, else
        ``terminated`` (the agent returned)."""
        with self._lock:
            reason, error = self.failure or (self.truncation or "terminated", "")
            for s in self.segments:
                s.trajectory.stop_reason, s.trajectory.error = reason, error
                s.trajectory.observations += [None] * (len(s.trajectory.actions) - len(s.trajectory.observations))
            trained = [s for s in self.segments if s.auxiliary is None or self.train_auxiliary]
            segments = [s.trajectory for s in trained]
            auxiliary = [s.trajectory for s in self.segments if s not in trained]
            task = [s for s in self.segments if s.auxiliary is None]
            if task:
                main = max(task, key=lambda s: s.used).trajectory
            else:  # the agent never called the model: nothing to train, one masked token to keep TRL's layout
                main = Trajectory(prompt_ids=[self.eos_token_ids[0]], stop_reason=reason, error=error)
                self.events["no_model_calls"] += 1
            values = {f.name: getattr(main, f.name) for f in fields(Trajectory)}
            events = Counter(self.events)
            for t in segments + auxiliary:
                events.update(t.events)
            values["events"] = dict(events)
            return AgentTrajectory(**values, segments=segments, auxiliary=auxiliary, agent_output=agent_output,
                                   requests=self.requests, refusal=self.refusal)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise RequestError(409, "this trajectory has ended (its agent returned, failed or timed out); its key "
                               "takes no more requests", code="trajectory_closed")

    def _truncate(self, reason: str) -> None:
        if self.truncation is None:
            self.truncation = reason

    def _over_budget(self, reason: str) -> Reply:
        self._truncate(reason)
        self.events["over_budget_requests"] += 1
        return Reply("", [], "length", [], None, [], 0)

    def _place_chat(self, request: ChatRequest) -> Placement:
        """Where a chat request goes: the segment it continues (its new messages' delta) or a new one."""
        segment, delta, fallback = self._extension(request)
        if segment is None:  # its ids are rendered once the request is accepted
            return Placement(None, [], request.messages, tools=request.tools, template_fallback=fallback)
        encoded, messages = delta
        return Placement(segment, encoded.ids, messages, text=encoded.text,
                         observation_truncated=encoded.observation_truncated)

    def _place_text(self, request: ChatRequest) -> Placement:
        """Where a legacy completion goes (:mod:`~trl_agentic.agents.completions`): the longest idle segment whose
        ids begin the prompt's ids token for token (the rest appended masked); else a new one."""
        prompt = request.prompt or ""
        ids = self._bos + self.encoder.tokenize_untrusted(prompt)
        best, joined = None, False
        for segment in self.segments:
            if segment.text is None or segment.busy or segment.auxiliary != request.auxiliary:
                continue
            held = segment.trajectory.prompt_ids + segment.trajectory.completion_ids
            if len(ids) > len(held) and ids[:len(held)] == held:
                if best is None or len(held) > len(best.trajectory.prompt_ids + best.trajectory.completion_ids):
                    best = segment
            joined = joined or (prompt.startswith(segment.text) and len(prompt) > len(segment.text))
        if best is None:  # joined: the text continues a segment, its tokens do not: never a re-tokenization
            return Placement(None, ids, prompt=prompt, text_join_mismatch=joined)
        held = len(best.trajectory.prompt_ids) + len(best.trajectory.completion_ids)
        return Placement(best, ids[held:], prompt=prompt,
                         text=prompt[len(best.text):] if prompt.startswith(best.text) else "")

    def _may_start(self, request: ChatRequest) -> bool:
        """Whether a request without proof of its sender may start a segment: never when the agent's own requests
        carry proof (``proves_sender``); else (an agent that builds its own client) the first conversation of the task
        binds the key, and a later one must open as a recorded one does (the same messages before the first reply, or
        the same prompt text begun): the same task, its history rewritten (a framework that re-renders it, a summary),
        not another agent's conversation. An auxiliary call binds nothing and may start its own segment unless
        auxiliary calls are trained (then it is held to the task's rule)."""
        if self.proves_sender:
            return False
        if request.auxiliary is not None and not self.train_auxiliary:
            return True
        task = [s for s in self.segments if s.auxiliary is None]
        if not task:
            return True
        if request.prompt is not None:
            return any(s.text is not None and request.prompt.startswith(s.trajectory.prompt) for s in task)
        opening = _opening(request.messages)
        return any(s.text is None and len(_opening(s.trajectory.prompt)) == len(opening)
                   and all(same_message(a, b) for a, b in zip(_opening(s.trajectory.prompt), opening))
                   for s in task)

    def _room(self, placement: Placement, forced: list[int], param: str) -> int:
        """The positions left to generate in once ``placement`` and ``forced`` are held (400
        ``context_length_exceeded`` when none is, or when a new segment's prompt is over ``max_prompt_tokens``)."""
        held = placement.ids if placement.segment is None else \
            placement.segment.trajectory.prompt_ids + placement.segment.trajectory.completion_ids + placement.ids
        if placement.segment is None and self.max_prompt_tokens is not None and len(held) > self.max_prompt_tokens:
            raise RequestError(400, f"the conversation is {len(held)} tokens, over max_prompt_tokens="
                               f"{self.max_prompt_tokens}", param, "context_length_exceeded")
        if self.context is None:
            return self.config.max_completion_length
        room = self.context.positions - len(held) - len(forced)
        if room <= 0:
            raise RequestError(400, f"the conversation is {len(held) + len(forced)} tokens, and the model takes "
                               f"{self.context.positions} positions ({self.context.source}); shorten or summarise it",
                               param, "context_length_exceeded")
        return room

    def _record(self, placement: Placement, auxiliary: str | None = None) -> Segment | None:
        """Record a placement: the new segment (recording an auxiliary call of kind ``auxiliary``, or the task), or the
        extended one; ``None`` (nothing recorded) past the budget."""
        if placement.template_fallback:
            self.events["template_fallback"] += 1
        if placement.text_join_mismatch:
            self.events["text_join_mismatch"] += 1
        segment = placement.segment
        if segment is None:
            t = Trajectory(prompt_ids=list(placement.ids))
            if placement.prompt is not None:
                t.prompt = placement.prompt
                segment = Segment(t, history=[], tools=[], text=placement.prompt, auxiliary=auxiliary)
            else:
                t.prompt = [dict(m) for m in placement.messages]
                segment = Segment(t, history=[dict(m) for m in placement.messages], tools=placement.tools,
                                  auxiliary=auxiliary)
            self.segments.append(segment)
            return segment
        if not self._append(segment, placement.ids, placement.text):
            return None
        if placement.prompt is not None:
            segment.text = placement.prompt
        else:
            segment.trajectory.messages.extend(placement.messages)
            segment.history.extend(placement.messages)
        if placement.observation_truncated:
            segment.trajectory.count("observation_truncated")
        return segment

    def _append(self, segment: Segment, ids: list[int], text: str) -> bool:
        """Append what the agent added between turns, masked; ``False`` (nothing appended) past the budget."""
        t = segment.trajectory
        if len(t.completion_ids) + len(ids) >= self.config.max_completion_length:
            return False
        t.completion_ids.extend(ids)
        t.env_mask.extend([0] * len(ids))
        t.logprobs.extend([0.0] * len(ids))
        t.observations.append(text)
        return True

    def _extension(self, request: ChatRequest) -> tuple[Segment | None, tuple[EncodedObservation, list] | None, bool]:
        """The segment this request continues (the longest idle match) and the delta of its new messages, and whether
        the template could not append them as a suffix (a new segment then)."""
        best: Segment | None = None
        for segment in self.segments:
            held = len(segment.history)
            if segment.text is not None or segment.busy or segment.tools != request.tools or len(request.messages) <= held \
                    or not segment.trajectory.turn_spans or segment.history[-1]["role"] != "assistant" \
                    or segment.auxiliary != request.auxiliary:
                continue  # busy, other tools, nothing new, no recorded reply to continue from, or task vs auxiliary
            if any(m["role"] == "assistant" for m in request.messages[held:]):
                continue
            if not all(same_message(a, b) for a, b in zip(segment.history, request.messages)):
                continue
            if best is None or (held, segment.used) > (len(best.history), best.used):
                best = segment
        if best is None:
            return None, None, False
        new = request.messages[len(best.history):]
        names = {c["id"]: c["function"]["name"] for c in best.history[-1].get("tool_calls", [])}
        observation = [{"role": m["role"], "name": _tool_name(names.get(m.get("tool_call_id", ""), "")),
                        "content": m["content"]} for m in new]
        last_start, last_end = best.trajectory.turn_spans[-1]
        try:
            encoded = self.encoder.encode_observation(observation, best.trajectory.completion_ids[last_start:last_end],
                                                      self.config.max_observation_tokens)
        except Exception:  # noqa: BLE001 - the template cannot append these messages as a suffix: start a segment
            return None, None, True
        return best, (encoded, [dict(m) for m in new]), False

    def _conversation_ids(self, request: ChatRequest) -> list[int]:
        """The ids of a new segment's prompt: the request's messages rendered whole (400 when they cannot be)."""
        if request.tools:
            try:
                ensure_response_parser(self.tokenizer)
            except ValueError as exc:
                raise RequestError(400, str(exc), "tools") from None
        try:
            return encode_conversation(self.encoder, request.messages, request.tools)
        except Exception as exc:  # noqa: BLE001 - jinja's TemplateError or the template's raise_exception()
            raise RequestError(400, f"the chat template cannot render these messages: {exc}", "messages") from None

    def _message(self, turn: Turn, ids: list[int], prefix: list[int], stopped: bool) -> dict[str, Any]:
        """The assistant message of a turn, as answered and as held in the history."""
        request = turn.request
        if request.tools and request.tool_calls_allowed:
            parsed = parse_turn(self.tokenizer, ids, prefix, request.tools)
            if "malformed" in parsed:
                turn.segment.trajectory.count("malformed_tool_call")
            content = parsed.get("content") or ""
            calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": str(c.get("function", c).get("name", "")),
                                   "arguments": c.get("function", c).get("arguments") or {}}}
                     for c in parsed.get("tool_calls") or []]
        else:
            content, calls = self._decode(ids), []
        if stopped:  # OpenAI leaves the stop string out of the content
            cuts = [content.find(s) for s in turn.stop if s in content]
            content = content[: min(cuts)] if cuts else content
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return message

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def _opening(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages before the first assistant message: the task a conversation was opened with."""
    first_reply = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return messages[:first_reply]


def _tool_name(name: str) -> str:
    """A tool message's name for the chat template: the called function's, when it is a plain name."""
    return name if NAME.match(name or "") else ""
