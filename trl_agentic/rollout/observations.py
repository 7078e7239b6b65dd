"""Turning prompts and observations into token ids, without re-tokenizing history and without letting untrusted text
become control tokens.

Two rollout modes (``rollout_mode``):

- ``"text"``: the model's text continues; an observation string is tokenized on its own and appended. For base
  models and Search-R1-style protocols (one user turn, the agent's whole episode in one assistant turn).
- ``"chat"``: each observation becomes a new message (role ``tool`` by default) rendered by the chat template. The
  template is probed once (:class:`ChatLayout`): the text it puts between the end of an assistant message and the
  observation's content (``prefix``), and after the content up to the next assistant header (``suffix``). An
  observation is then ``prefix + content + suffix``, closed by the end-of-turn token first when the model's turn
  did not end with an end id (a stop string or a budget ended it). Native tool results are a list of ``tool``
  messages rendered together after an assistant tool call (Qwen puts several ``<tool_response>`` blocks in one
  user turn): the template text around and between their contents is probed once per sequence of tool names
  (``_message_layout``), and each content goes in as untrusted text.

Untrusted text: observations, and the text ``Environment.reset`` adds to a prompt, come from tools, web pages and
programs. *Control tokens* in them are tokenized as plain text, never as the tokens, so tool output cannot forge
the end of a turn or a role header (:meth:`ObservationEncoder.tokenize_untrusted`). Control tokens are, as for
transformers' ``apply_chat_template(sanitize_control_tokens=True)``, the tokenizer's special tokens (``<|im_end|>``,
``<eos>``, ``<|start_header_id|>``) plus, in chat mode, the added tokens the chat template itself writes (Qwen3's
``<tool_response>``). Only the template's own text (``prefix``/``suffix``) is tokenized with them parsed. Other
added tokens (protocol tags such as ``<answer>`` in a tokenizer that has them) keep their single-token form.

Caps: ``max_tokens`` bounds the tokens of an observation's *content*: the tool output inside its wrapping tag in
text mode (``\\n\\n<information>...</information>\\n\\n`` keeps both tags), the message content in chat mode (the
template's tokens around it are kept whole). The head is kept and ``TRUNCATION_MARKER`` appended.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

RolloutMode = Literal["text", "chat"]

TRUNCATION_MARKER = "\n...[truncated]"
"""Appended to an observation's content when the token cap cut it."""

_SENTINEL = "TRLAGENTICOBSERVATIONSENTINEL"
_PROBE = '  a "quoted" \\ word\n\tand é  '
_CHARS_PER_TOKEN_CAP = 16  # content longer than 16 * max_tokens characters is cut before tokenizing
_WRAPPED = re.compile(r"^(\s*<([A-Za-z_][\w-]*)>)(.*)(</\2>\s*)$", re.DOTALL)
_CONTENT_TRANSFORMS: dict[str, Callable[[str], str]] = {
    "verbatim": lambda s: s,
    "strip": lambda s: s.strip(),
    "json": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],  # Llama-3's `content | tojson`, quotes in the layout
    "repr": repr,  # a string inside a list rendered by Jinja as Python's str(): its quotes depend on the string
}
"""How a template writes an untrusted string. ``repr`` includes its quotes (Python picks them per string), so the
template text around a ``repr`` gap is kept without the quotes it had around the probe (:func:`_unquoted`)."""


def _join(pieces: list[str], slots: list[int], transform_of: Callable[[int], str], value: Callable[[int], str]) -> str:
    """The text of a layout with ``value(k)`` written by ``transform_of(k)`` in each gap of string ``k``; ``pieces``
    as probed (with the quotes a ``repr`` gap had around the probe)."""
    gaps = [(k, transform_of(k)) for k in slots]
    bare = _unquoted(pieces, gaps)
    return bare[0] + "".join(_CONTENT_TRANSFORMS[t](value(k)) + p for (k, t), p in zip(gaps, bare[1:]))


def _unquoted(pieces: list[str], gaps: list[tuple[int, str]]) -> list[str]:
    """``pieces`` without the quote before and after each ``repr`` gap (``repr`` writes its own)."""
    pieces = list(pieces)
    for i, (_, transform) in enumerate(gaps):
        if transform == "repr":
            pieces[i], pieces[i + 1] = pieces[i][:-1], pieces[i + 1][1:]
    return pieces


_SLOT = re.compile(_SENTINEL + r"(\d+)Z")
_MAX_LAYOUTS = 4096


def _untrusted_strings(content: Any) -> list[str]:
    """The strings of a message content that come from a tool: the content itself, or every string inside a list
    result (content parts, rows, ...; at any depth) but the ``"type"`` of a part, in order."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, dict):
        return [s for key, value in content.items() if key != "type" for s in _untrusted_strings(value)]
    if isinstance(content, (list, tuple)):
        return [s for value in content for s in _untrusted_strings(value)]
    return []


Shape = tuple
"""A content with its untrusted strings blanked, hashable (a key of the probed layouts): ``("str",)`` for a
string, ``("list" | "tuple", items)``, ``("dict", ((key, value shape), ...))`` (a part's ``"type"`` kept as
``("type", value)``), ``("value", x)`` for anything else (numbers, ``None``)."""


def _shape(content: Any, key: str | None = None) -> Shape:
    if isinstance(content, str):
        return ("type", content) if key == "type" else ("str",)
    if isinstance(content, dict):
        return ("dict", tuple((k, _shape(v, k)) for k, v in content.items()))
    if isinstance(content, (list, tuple)):
        return (type(content).__name__, tuple(_shape(v) for v in content))
    return ("value", content)


def _shape_slots(shape: Shape) -> list[str]:
    """For each untrusted string of a content of this shape, ``"text"`` (a string content: the template must write
    it) or ``"part"`` (a string inside a list: the template may drop it)."""
    if shape == ("str",):
        return ["text"]

    def count(node: Shape) -> int:
        kind = node[0]
        if kind == "str":
            return 1
        if kind == "dict":
            return sum(count(v) for _, v in node[1])
        if kind in ("list", "tuple"):
            return sum(count(v) for v in node[1])
        return 0

    return ["part"] * count(shape)


def _fill_shape(shape: Shape, fill: Callable[[], str]) -> Any:
    """A content of this shape with each untrusted string replaced by ``fill()``, in order."""
    kind = shape[0]
    if kind == "str":
        return fill()
    if kind in ("type", "value"):
        return shape[1]
    if kind == "dict":
        return {k: _fill_shape(v, fill) for k, v in shape[1]}
    items = [_fill_shape(v, fill) for v in shape[1]]
    return tuple(items) if kind == "tuple" else items


class ChatTemplateError(ValueError):
    """The chat template cannot be used for chat-mode rollouts; the message says why and what to pass instead."""


class TemplateNotPrefixPreservingError(ChatTemplateError):
    """The chat template renders earlier messages differently once a message is added."""


def is_conversational(prompt: Any) -> bool:
    """A prompt made of chat messages: TRL's ``is_conversational`` on a row holding it, ``False`` for an empty or
    missing prompt (on which TRL's raises)."""
    from trl import is_conversational as trl_is_conversational

    return isinstance(prompt, list) and bool(prompt) and trl_is_conversational({"prompt": prompt})


@dataclass(frozen=True)
class EncodedObservation:
    """Token ids to append (all masked), the text the model reads (in chat mode the message content), and whether
    the cap cut it."""

    ids: list[int]
    text: str
    observation_truncated: bool


@dataclass(frozen=True)
class ChatLayout:
    """How a chat template renders an observation message after an assistant turn.

    Attributes:
        end_of_turn_id: The token that closes an assistant message.
        prefix: Template text after that token and before the content.
        suffix: Template text after the content, through the next assistant header.
        transform: How the template writes the content (``"verbatim"``, ``"strip"`` or ``"json"``).
    """

    end_of_turn_id: int
    prefix: str
    suffix: str
    transform: str


class ObservationEncoder:
    """Tokenizes prompts and observations for one tokenizer and rollout mode.

    Args:
        processing_class: The policy's tokenizer (or a processor with a ``tokenizer``).
        rollout_mode: ``"text"`` or ``"chat"``.
        observation_role: Message role of observations in chat mode (``"tool"``; ``"user"`` for templates without a
            tool role, such as Gemma's).
        chat_template_kwargs: Extra keyword arguments for ``apply_chat_template`` (e.g. ``enable_thinking``).
        eos_token_ids: Ids that end a model turn (every end-of-sequence id of the model). In chat mode a turn that
            ended on one of them is not closed again.
    """

    def __init__(
        self,
        processing_class: Any,
        rollout_mode: RolloutMode = "text",
        observation_role: str = "tool",
        chat_template_kwargs: dict[str, Any] | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        if rollout_mode not in ("text", "chat"):
            raise ValueError(f"rollout_mode must be 'text' or 'chat', got {rollout_mode!r}")
        self.tokenizer = getattr(processing_class, "tokenizer", processing_class)
        self.rollout_mode = rollout_mode
        self.observation_role = observation_role
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.eos_token_ids = set(eos_token_ids)
        self.control_tokens = self._find_control_tokens()
        self._control_re = re.compile("(" + "|".join(map(re.escape, self.control_tokens)) + ")") if self.control_tokens else None
        self._control_ids = {self.tokenizer.convert_tokens_to_ids(t) for t in self.control_tokens}
        self.layout: ChatLayout | None = self._probe_template() if rollout_mode == "chat" else None
        self._message_layouts: dict[tuple[tuple[str, str, Shape], ...], tuple[list[str], list[tuple[int, str]]]] = {}

    def turn_end_ids(self, eos_token_ids: Sequence[int]) -> list[int]:
        """Every id that ends a model turn: the model's end ids (``eos_token_ids``, TRL's) and, in chat mode, the
        template's end-of-turn token (Gemma's ``<end_of_turn>`` is not among its end ids)."""
        end_of_turn = [self.layout.end_of_turn_id] if self.layout is not None else []
        return list(dict.fromkeys([*eos_token_ids, *end_of_turn]))

    # -- tokenization ----------------------------------------------------------------------------------------
    def tokenize_untrusted(self, text: str) -> list[int]:
        """Ids of ``text`` with every control-token string in it encoded as plain text, and no BOS/EOS added;
        ``decode`` gives ``text`` back."""
        if self._control_re is None or not self._control_re.search(text):
            return self._encode_plain(text)
        ids: list[int] = []
        for i, piece in enumerate(self._control_re.split(text)):
            if piece:
                ids += self._control_as_text(piece) if i % 2 else self._encode_plain(piece)
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def _control_as_text(self, token: str) -> list[int]:
        """A control-token string as text: split after its first character (so that no added token matches),
        or, if a control id still appears, one character at a time."""
        ids = self._encode_plain(token[:1]) + self._encode_plain(token[1:])
        if self._control_ids.isdisjoint(ids):
            return ids
        return [i for ch in token for i in self._encode_plain(ch)]

    def _tokenize_template(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _has_control(self, text: str) -> bool:
        return self._control_re is not None and self._control_re.search(text) is not None

    def _find_control_tokens(self) -> list[str]:
        """Special tokens, plus (chat mode) the non-whitespace added tokens that the chat template writes."""
        template = self.chat_template_kwargs.get("chat_template") or getattr(self.tokenizer, "chat_template", None)
        template = template if self.rollout_mode == "chat" else None
        template = template if isinstance(template, str) else ""
        strings = set(getattr(self.tokenizer, "all_special_tokens", []) or [])
        for token in getattr(self.tokenizer, "added_tokens_decoder", {}).values():
            content = str(token)
            if getattr(token, "special", False) or (content in template and not content.isspace()):
                strings.add(content)
        return sorted((s for s in strings if s), key=len, reverse=True)

    # -- prompts ---------------------------------------------------------------------------------------------
    def encode_prompt(self, prompt: Any, suffix: str | None = None, tools: Sequence[Any] = ()) -> list[int]:
        """Token ids of a prompt: a string (tokenized as the tokenizer does, BOS included where it adds one), or
        chat messages rendered with the generation prompt (and the JSON schemas of ``tools``, for native tool
        calls). ``suffix`` (text returned by ``Environment.reset``) is appended to the string or to the last
        message's content, as untrusted text."""
        if not is_conversational(prompt):
            if tools:
                raise ValueError("native tool calls need conversational prompts (a list of chat messages), got text")
            ids = list(self.tokenizer(text=prompt)["input_ids"])
            return ids + self.tokenize_untrusted(suffix) if suffix else ids
        messages = [dict(m) for m in prompt]
        if not suffix or not self._has_control(suffix):
            if suffix:
                messages[-1]["content"] = messages[-1]["content"] + suffix
            return self._render_ids(messages, add_generation_prompt=True, tools=tools)
        messages[-1]["content"] = messages[-1]["content"] + _SENTINEL
        before, after = self.render_text(messages, add_generation_prompt=True, tools=tools).split(_SENTINEL)
        return self._tokenize_template(before) + self.tokenize_untrusted(suffix) + self._tokenize_template(after)

    # -- observations ----------------------------------------------------------------------------------------
    def encode_observation(self, text: str | list[dict[str, Any]], last_action_ids: Sequence[int],
                           max_tokens: int) -> EncodedObservation:
        """Ids to append after a turn whose sampled ids were ``last_action_ids``; see the module docstring. In chat
        mode ``text`` may be a list of messages (native tool results), rendered together; ``max_tokens`` then caps
        each content."""
        if self.rollout_mode == "text":
            if not isinstance(text, str):
                raise TypeError("an observation given as messages needs rollout_mode='chat'")
            return self._encode_text(text, max_tokens)
        return self._encode_chat(text, last_action_ids, max_tokens)

    def _cap(self, content: str, max_tokens: int) -> tuple[list[int], bool]:
        """Content ids cut to ``max_tokens`` (marker included), and whether they were cut."""
        char_cap = _CHARS_PER_TOKEN_CAP * max_tokens
        cut = len(content) > char_cap
        ids = self.tokenize_untrusted(content[:char_cap] if cut else content)
        if not cut and len(ids) <= max_tokens:
            return ids, False
        marker = self.tokenize_untrusted(TRUNCATION_MARKER)
        return ids[: max(0, max_tokens - len(marker))] + marker, True

    def _encode_text(self, text: str, max_tokens: int) -> EncodedObservation:
        match = _WRAPPED.match(text)
        prefix, content, suffix = (match.group(1), match.group(3), match.group(4)) if match else ("", text, "")
        content_ids, truncated = self._cap(content, max_tokens)
        if truncated:
            ids = self.tokenize_untrusted(prefix) + content_ids + self.tokenize_untrusted(suffix)
        else:
            ids = self.tokenize_untrusted(text)
        return EncodedObservation(ids, self.tokenizer.decode(ids, skip_special_tokens=False), truncated)

    def _encode_chat(self, observation: str | list[dict[str, Any]], last_action_ids: Sequence[int],
                     max_tokens: int) -> EncodedObservation:
        if isinstance(observation, str):
            layout = self.layout
            pieces, gaps, values = [layout.prefix, layout.suffix], [(0, layout.transform)], [observation]
        else:
            contents = [m.get("content") if m.get("content") is not None else "" for m in observation]
            shapes = tuple((m["role"], m.get("name", ""), _shape(c)) for m, c in zip(observation, contents))
            pieces, gaps = self._message_layout(shapes)
            values = [text for content in contents for text in _untrusted_strings(content)]
        capped, truncated = [], False
        for value in values:
            value_ids, cut = self._cap(value, max_tokens)
            capped.append(self.tokenizer.decode(value_ids, skip_special_tokens=False) if cut else value)
            truncated = truncated or cut
        written = [_CONTENT_TRANSFORMS[transform](capped[k]) for k, transform in gaps]
        if any(self._has_control(w) for w in written):
            ids = self._tokenize_template(pieces[0])
            for content, piece in zip(written, pieces[1:]):
                ids += self.tokenize_untrusted(content) + self._tokenize_template(piece)
        else:  # no special-token string in the contents: one call gives the template's own tokenization
            ids = self._tokenize_template(pieces[0] + "".join(w + p for w, p in zip(written, pieces[1:])))
        if not last_action_ids or last_action_ids[-1] not in self.eos_token_ids | {self.layout.end_of_turn_id}:
            ids = [self.layout.end_of_turn_id, *ids]
        return EncodedObservation(ids, "\n".join(capped), truncated)

    def _message_layout(self, shapes: tuple[tuple[str, str, Shape], ...]) -> tuple[list[str], list[tuple[int, str]]]:
        """How the template renders these messages (``(role, name, content shape)`` each, :func:`_shape`) after an
        assistant turn that called a tool: the template text around and between the untrusted strings of their
        contents (``pieces``, one more than the gaps) and, for each gap, which string goes there (an index into the
        contents' strings in order, :func:`_untrusted_strings`) and how the template writes it (a transform of
        :data:`_CONTENT_TRANSFORMS`: Qwen2.5 writes a list content as Python's ``str()`` of the list, so its strings
        as ``repr``; a template may also drop them, as Qwen3's drops list contents). Probed once per sequence of
        shapes."""
        if shapes in self._message_layouts:
            return self._message_layouts[shapes]
        if len(self._message_layouts) >= _MAX_LAYOUTS:  # the numbers of list results are part of their shape
            self._message_layouts.clear()
        call = {"type": "function", "function": {"name": shapes[0][1] or "tool", "arguments": {}}}
        end_string = self.tokenizer.convert_ids_to_tokens(self.layout.end_of_turn_id)
        kinds = [kind for shape in shapes for kind in _shape_slots(shape[2])]

        def render(fill: Callable[[int], str]) -> str:
            counter = iter(range(len(kinds)))
            messages = [{"role": role, "name": name, "content": _fill_shape(shape, lambda: fill(next(counter)))}
                        for role, name, shape in shapes]
            return self.render_text(dummy + messages, add_generation_prompt=True)

        sentinel = lambda k: f"{_SENTINEL}{k}Z"  # noqa: E731
        for reasoning in ("", "<think>\nOK.\n</think>\n\n"):  # the second survives Qwen3's history stripping
            dummy = [{"role": "user", "content": "Hello."},
                     {"role": "assistant", "content": reasoning, "tool_calls": [call]}]
            base = self.render_text(dummy, add_generation_prompt=False)
            cut = base.rfind(end_string) + len(end_string)
            full = render(sentinel)
            found = [int(k) for k in _SLOT.findall(full)]
            if (cut >= len(end_string) and full.startswith(base[:cut])
                    and all(found.count(k) == 1 for k, kind in enumerate(kinds) if kind == "text")):
                break
        else:
            raise TemplateNotPrefixPreservingError(
                f"The chat template of {self._template_name()} does not render tool messages after an assistant "
                "tool call as an appendable suffix; use a template that renders earlier turns unchanged"
            )
        split = _SLOT.split(full[cut:])
        pieces, slots = split[0::2], [int(k) for k in split[1::2]]
        transforms: dict[int, str] = {}
        for k in sorted(set(slots)):  # each string on its own: the probe in its gaps, the sentinels elsewhere
            value = lambda j: _PROBE if j == k else sentinel(j)  # noqa: E731
            probe = render(value)[cut:]
            for name in _CONTENT_TRANSFORMS:
                if probe == _join(pieces, slots, lambda j: name if j == k else "verbatim", value):
                    transforms[k] = name
                    break
            else:
                raise ChatTemplateError(
                    f"the chat template of {self._template_name()} rewrites tool message content in a way "
                    "trl-agentic cannot reproduce token for token"
                )
        gaps = [(k, transforms[k]) for k in slots]
        pieces = _unquoted(pieces, gaps)
        self._message_layouts[shapes] = (pieces, gaps)
        return pieces, gaps

    # -- chat template ---------------------------------------------------------------------------------------
    def _template_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__

    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: Sequence[Any] = ()) -> str:
        """``messages`` (with the schemas of ``tools``) rendered by the chat template, as text."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self._template_kwargs(tools)
        )

    def _template_kwargs(self, tools: Sequence[Any]) -> dict[str, Any]:
        """``chat_template_kwargs`` with the tool schemas: the environment's native tools, else a ``tools`` entry of
        ``chat_template_kwargs`` (TRL's config field, where a user may put them), else ``None`` (not ``[]``: Llama's
        template writes its tool boilerplate for an empty list)."""
        return {**self.chat_template_kwargs, "tools": list(tools) or self.chat_template_kwargs.get("tools") or None}

    def _render_ids(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                    tools: Sequence[Any] = ()) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True,
            **self._template_kwargs(tools),
        )["input_ids"]
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        return list(ids)

    def _end_of_turn_id(self, dummy: list[dict[str, str]]) -> int:
        """The token that closes an assistant message: the last control token (a special token, or an added token
        the template writes) of the rendered assistant turn."""
        base = self._render_ids(dummy, add_generation_prompt=False)
        candidates = self._control_ids | self.eos_token_ids
        for token in reversed(base):
            if token in candidates:
                return token
        raise ChatTemplateError(
            f"rollout_mode='chat': the chat template of {self._template_name()} ends an assistant message with no "
            "special token, so the end of a turn cannot be told apart from text; use rollout_mode='text'"
        )

    def _probe_template(self) -> ChatLayout:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ChatTemplateError("rollout_mode='chat' needs a tokenizer with a chat template; use rollout_mode='text'")
        user = {"role": "user", "content": "Hello."}
        dummies = [  # the second keeps reasoning in the assistant turn (Qwen3 strips an empty one from history)
            [user, {"role": "assistant", "content": "Hi."}],
            [user, {"role": "assistant", "content": "<think>\nOK.\n</think>\n\nHi."}],
        ]
        for dummy in dummies:
            end_of_turn_id = self._end_of_turn_id(dummy)
            base = self.render_text(dummy, add_generation_prompt=False)
            full = self._observation_render(dummy, _SENTINEL)
            if full.startswith(base) and full.count(_SENTINEL) == 1:
                end_string = self.tokenizer.convert_ids_to_tokens(end_of_turn_id)
                cut = base.rfind(end_string) + len(end_string)
                prefix, suffix = full[cut:].split(_SENTINEL)
                probe_tail = self._observation_render(dummy, _PROBE)[cut:]
                for name, transform in _CONTENT_TRANSFORMS.items():
                    if probe_tail == prefix + transform(_PROBE) + suffix:
                        return ChatLayout(end_of_turn_id, prefix, suffix, name)
                raise ChatTemplateError(
                    f"the chat template of {self._template_name()} rewrites {self.observation_role!r} message "
                    "content in a way trl-agentic cannot reproduce token for token; use rollout_mode='text' or "
                    "another observation_role"
                )
        raise TemplateNotPrefixPreservingError(
            f"The chat template of {self._template_name()} is not prefix-preserving: adding an observation message "
            "changes the tokens of earlier messages, so an appended observation would not match what the model "
            "conditions on. Use rollout_mode='text', or a template that renders earlier turns unchanged."
        )

    def _observation_render(self, dummy: list[dict[str, str]], content: str) -> str:
        messages = dummy + [{"role": self.observation_role, "content": content}]
        try:
            return self.render_text(messages, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - jinja's TemplateError or a raise_exception() of the template
            raise ChatTemplateError(
                f"the chat template of {self._template_name()} rejects an observation message with role "
                f"{self.observation_role!r} ({type(exc).__name__}: {exc}); pass observation_role='user' for templates "
                "without a tool role (Gemma), or rollout_mode='text'"
            ) from None
