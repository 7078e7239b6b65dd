r"""Render trajectories as one self-contained HTML page, to see what the model sampled and what it was trained on.

    python -m trl_agentic.render out/trajectories/trajectories-rank0.jsonl -o rollouts.html --tokenizer out/model

Each trajectory is shown turn by turn: the prompt, then per turn the model's action and the environment's
observation. With a tokenizer the page shows every token in its own box: sampled tokens (``env_mask == 1``, in the
loss) on green, observation tokens (``env_mask == 0``, masked out of the loss) in grey italics in a dashed box,
prompt tokens in blue; hovering a token shows its id, position and mask, and for a sampled token the log-probability
the generator reported (or that none was recorded). Without a tokenizer the text of the actions and observations is
shown instead. Every number is labelled with what it is: the reward of the reward functions (a row's ``reward``),
the environment's own step rewards (``StepResult.reward``, shown only when the environment gives any), the training
step. Columns of the index that no row fills are left out. The page has inline CSS only: no script, no network
access.

Untrusted text is shown as it is, never interpreted: it is HTML-escaped, C0 controls appear as control pictures
(U+2400 block), and characters that would hide or reorder text are shown as badges instead of written raw: Unicode
bidi controls (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069, "Trojan Source", CVE-2021-42574) and C1 controls as
``<U+202E>``, lone surrogates (not encodable as UTF-8, e.g. from a JSON ``"\ud800"`` escape or undecodable bytes)
as ``\ud800``. The command line skips a line of the JSONL file that is not a JSON object or not a trajectory (no
``prompt_ids``, a field of the wrong type), with a warning naming the file, the line and the field (bytes that are
not UTF-8 are kept as lone surrogates, so they are shown, not fatal); in :func:`render_html` a row that is no
trajectory costs only its own section, which shows the error.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from .trajectory import Trajectory, row_problem

logger = logging.getLogger(__name__)

# Keys ``Trajectory.to_dict`` derives from the fields; they are recomputed, not shown as extras.
_DERIVED_KEYS = frozenset({"num_turns", "env_reward", "truncated"})
# What the row keys written by training and evaluation are, as the header labels them (other keys show as named).
_EXTRA_LABELS = {
    "step": "training step",
    "reward": "reward (reward functions)",
    "rewards": "each reward function",
    "advantage": "advantage",
    "success": "success",
    "row": "dataset row",
}

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 1.5rem; color: #1d1d1f;
  background: #fafafa; }
h1 { font-size: 1.4rem; margin: 0 0 .5rem; }
h2 { font-size: 1.1rem; margin: 0 0 .5rem; }
.legend, .summary, .traj { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: .75rem 1rem;
  margin-bottom: 1rem; }
.legend span.key { display: inline-block; margin-right: 1.25rem; padding: 0 .3rem; border-radius: 3px;
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace; border: 1px solid transparent; }
table.index { border-collapse: collapse; font-size: .85rem; }
table.index td, table.index th { padding: .15rem .6rem; border-bottom: 1px solid #eee; text-align: left; }
dl.meta { display: flex; flex-wrap: wrap; gap: .25rem 1.25rem; margin: 0 0 .75rem; font-size: .85rem; }
dl.meta div { display: flex; gap: .3rem; }
dl.meta dt { color: #666; }
dl.meta dd { margin: 0; font-weight: 600; }
.flag { color: #b00020; }
.block { margin: .4rem 0; padding: .4rem .6rem; border-left: 4px solid #ccc; background: #fcfcfc; }
.block.prompt-block { border-left-color: #7aa2e3; }
.block.action { border-left-color: #3a9d3a; }
.block.observation { border-left-color: #999; }
.block.tool-calls { border-left-color: #c98a1a; }
ol.calls { margin: 0; padding-left: 1.5rem; font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
  font-size: .85rem; white-space: pre-wrap; word-break: break-word; }
.turn { margin: .75rem 0; }
.turn-head, .label { font-size: .8rem; color: #555; margin-bottom: .2rem; }
.turn-head { font-weight: 600; color: #333; }
.tokens, pre.text { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .85rem;
  white-space: pre-wrap; word-break: break-word; margin: 0; line-height: 1.9; }
.tok { border: 1px solid; border-radius: 2px; margin-right: 1px; padding: 0 1px; }
.trained { background: #d3f5d3; border-color: #6dbf6d; color: #0b3d0b; }
.masked { background: #efefef; border-color: #bbb; border-style: dashed; color: #777; font-style: italic; }
.prompt { background: #e7eefb; border-color: #a9c1ea; color: #27344d; }
pre.text.action-text { color: #0b3d0b; }
pre.text.observation-text { color: #666; font-style: italic; }
.none { color: #999; font-style: italic; font-size: .85rem; }
details.plain { margin-top: .3rem; font-size: .8rem; }
details.plain summary { color: #666; cursor: pointer; }
.cc { font-style: normal; font-size: .75em; color: #8a1c00; background: #fff0e0; border: 1px solid #e0a070;
  border-radius: 2px; padding: 0 2px; margin: 0 1px; }
.traj.broken { border-color: #b00020; }
"""


# C0 control characters (but tab and newline) and DEL, shown as their Unicode control pictures (U+2400 block).
_CONTROL_PICTURES = {i: 0x2400 + i for i in range(32) if chr(i) not in "\t\n"} | {0x7F: 0x2421}
# Never written raw: lone surrogates, the Unicode Bidi_Control characters, C1 controls.
_HIDDEN = re.compile("[\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\x80-\x9f]")


def _escape_of(char: str) -> str:
    """The visible stand-in of a hidden character: ``\\ud800`` for a lone surrogate, ``<U+202E>`` otherwise."""
    code = ord(char)
    return f"\\u{code:04x}" if 0xD800 <= code <= 0xDFFF else f"<U+{code:04X}>"


def _badge(match: re.Match[str]) -> str:
    escape = _escape_of(match.group())
    return f'<span class="cc" title="hidden character shown escaped">{html.escape(escape)}</span>'


def _esc(text: Any) -> str:
    """HTML-escape ``text`` (quotes included) for element content: control characters become visible, hidden ones
    (bidi controls, lone surrogates) become badges."""
    return _HIDDEN.sub(_badge, html.escape(str(text)).translate(_CONTROL_PICTURES))


def _plain(text: Any) -> str:
    """HTML-escape ``text`` where markup is not allowed (attribute values, ``<title>``): hidden characters become
    their escapes as plain text."""
    return html.escape(_HIDDEN.sub(lambda m: _escape_of(m.group()), str(text)).translate(_CONTROL_PICTURES))


def _as_row(trajectory: Trajectory | Mapping[str, Any]) -> tuple[Trajectory, dict[str, Any]]:
    """Split a ``Trajectory`` or a JSONL row into the trajectory and its extra keys (``step``, ``reward``, ...)."""
    if isinstance(trajectory, Trajectory):
        return trajectory, {}
    fields = Trajectory.__dataclass_fields__
    extras = {k: v for k, v in trajectory.items() if k not in fields and k not in _DERIVED_KEYS}
    return Trajectory.from_dict(dict(trajectory)), extras


def _fmt(value: Any) -> str:
    """A short, unescaped text form of a header value."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (int, str)):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _prompt_text(prompt: Any) -> str:
    """The prompt as text: a string as is, chat messages as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)
    return "" if prompt is None else _fmt(prompt)


class _TokenRenderer:
    """Renders token ids as one ``<span class="tok ...">`` each, decoding every id once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        """The visible text of one token: decoded on its own, newlines marked ``↵``, empty ones as ``∅``."""
        if token_id not in self._cache:
            decoded = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = decoded.replace("\n", "↵\n") if decoded else "∅"
        return self._cache[token_id]

    def span(self, token_id: int, css: str, tooltip: str) -> str:
        """One token's box."""
        return f'<span class="tok {css}" title="{_plain(tooltip)}">{_esc(self.text(token_id))}</span>'

    def prompt(self, ids: Sequence[int]) -> str:
        """The prompt tokens (never trained on), with their id and position."""
        spans = (self.span(t, "prompt", f"id {t} · prompt position {i} · prompt") for i, t in enumerate(ids))
        return f'<div class="tokens">{"".join(spans)}</div>'

    def completion(self, t: Trajectory, start: int, end: int) -> str:
        """Completion tokens ``start:end``, styled by their ``env_mask`` value, or a note when the range is empty."""
        if start >= end:
            return '<span class="none">(no tokens)</span>'
        spans = []
        for pos in range(start, end):
            token_id, mask = t.completion_ids[pos], t.env_mask[pos]
            if mask:
                logprob = t.logprobs[pos] if pos < len(t.logprobs) else None
                known = f"log-prob {logprob:.4g}" if logprob is not None else "log-prob not recorded"
                tooltip = f"id {token_id} · position {pos} · sampled, trained (env_mask 1) · {known}"
            else:  # not sampled: it has no log-prob
                tooltip = f"id {token_id} · position {pos} · observation, masked (env_mask 0)"
            spans.append(self.span(token_id, "trained" if mask else "masked", tooltip))
        return f'<div class="tokens">{"".join(spans)}</div>'


def _text_block(text: str | None, css: str) -> str:
    """Escaped text in a ``<pre>``, or a note for a missing one."""
    if text is None:
        return '<span class="none">(none)</span>'
    return f'<pre class="text {css}">{_esc(text)}</pre>'


def _block(css: str, label: str, body: str) -> str:
    """A labelled block: the prompt, an action or an observation."""
    return f'<div class="block {css}"><div class="label">{_esc(label)}</div>{body}</div>'


def _item(values: Sequence[Any], index: int) -> Any:
    """``values[index]``, or ``None`` past the end (per-turn lists can be shorter than the turns)."""
    return values[index] if index < len(values) else None


def _has_step_rewards(t: Trajectory) -> bool:
    """Whether the environment gave any step reward (``StepResult.reward``); most give none (all 0)."""
    return any(r != 0 for r in t.turn_rewards)


def _meta(t: Trajectory, extras: dict[str, Any]) -> str:
    """The header of one trajectory, each value labelled: step, reward, the environment's step rewards (when it gives
    any), turns, stop reason, truncation (when truncated), token counts, events (when any), the other extras."""
    items: list[tuple[str, str, bool]] = []  # (label, value, highlighted)
    items += [(_EXTRA_LABELS[k], _fmt(extras[k]), False) for k in ("step", "reward") if k in extras]
    if _has_step_rewards(t):
        items.append(("environment reward (sum of step rewards)", _fmt(t.env_reward), False))
    items += [("turns", str(t.num_turns), False), ("stop reason", t.stop_reason or "?", False)]
    if t.truncated:
        items.append(("truncated", "yes (did not end on its own)", True))
    items += [
        ("prompt tokens", str(len(t.prompt_ids)), False),
        ("agent tokens (trained)", str(t.num_agent_tokens), False),
        ("observation tokens (masked)", str(t.num_observation_tokens), False),
    ]
    if t.events:
        items.append(("events", ", ".join(f"{k}×{v}" for k, v in sorted(t.events.items())), True))
    items += [(_EXTRA_LABELS.get(k, k), _fmt(v), False) for k, v in extras.items()
              if k not in ("step", "reward", "turn_advantages")]  # each turn's advantage is shown with its turn
    cells = []
    for name, value, flag in items:
        dd = '<dd class="flag">' if flag else "<dd>"
        cells.append(f"<div><dt>{_esc(name)}</dt>{dd}{_esc(value)}</dd></div>")
    return f'<dl class="meta">{"".join(cells)}</dl>'


def _turn_head(t: Trajectory, k: int, extras: dict[str, Any]) -> str:
    """Turn number, the environment's step reward for it (when the environment gives any), the turn's advantage (when
    the trainer's advantages were per token: PPO's, GiGPO's) and its info."""
    parts = [f"Turn {k + 1}"]
    if k < len(t.turn_rewards) and _has_step_rewards(t):
        parts.append(f"step reward (environment) {_fmt(t.turn_rewards[k])}")
    advantage = _item(extras.get("turn_advantages") or [], k)
    if advantage is not None:
        parts.append(f"advantage {_fmt(advantage)}")
    info = _item(t.turn_infos, k)
    if info:
        parts.append(f"info {_fmt(info)}")
    return f'<div class="turn-head">{_esc(" · ".join(parts))}</div>'


def _tool_calls(t: Trajectory) -> list[list[list[Any]]]:
    """Per turn, the native tool calls of ``t.messages`` as ``[name, arguments, result]`` (each assistant message is
    one turn; each ``tool`` message answers the turn's next unanswered call, or, for a call the parser could not
    read, stands alone with name ``None``)."""
    turns: list[list[list[Any]]] = []
    for message in t.messages:
        if message.get("role") == "assistant":
            turns.append([[c.get("function", c).get("name"), c.get("function", c).get("arguments"), None]
                          for c in message.get("tool_calls") or []])
        elif message.get("role") == "tool" and turns:
            call = next((c for c in turns[-1] if c[2] is None), None)
            if call is None:
                turns[-1].append(call := [None, None, None])
            call[2] = message.get("content")
    return turns


def _calls_block(calls: list[list[Any]]) -> str:
    """The turn's tool calls, each ``name(arguments) → result``."""
    items = []
    for name, arguments, result in calls:
        head = "(a call the parser could not read)" if name is None else f"{name}({json.dumps(arguments, default=str)})"
        items.append(f"<li>{_esc(head)} → {_esc(result) if result is not None else '(no result)'}</li>")
    return _block("tool-calls", "Tool calls (native)", f'<ol class="calls">{"".join(items)}</ol>')


def _render_turns(t: Trajectory, tokens: _TokenRenderer | None, extras: dict[str, Any]) -> str:
    """The prompt and every turn. In token mode the blocks cover each completion position exactly once: anything
    before the first turn, then per turn its sampled span and the observation tokens up to the next turn."""
    calls = [_calls_block(c) if c else "" for c in _tool_calls(t)]
    if tokens is None:
        parts = [_block("prompt-block", "Prompt", _text_block(_prompt_text(t.prompt), "prompt-text"))]
        for k, action in enumerate(t.actions):
            observation = _text_block(_item(t.observations, k), "observation-text")
            parts.append(
                f'<div class="turn">{_turn_head(t, k, extras)}'
                f'{_block("action", "Action (trained)", _text_block(action, "action-text"))}{_item(calls, k) or ""}'
                f'{_block("observation", "Observation (masked)", observation)}</div>'
            )
        return "".join(parts)

    parts = [_block("prompt-block", "Prompt", tokens.prompt(t.prompt_ids))]
    spans = list(t.turn_spans)
    first = spans[0][0] if spans else len(t.completion_ids)
    if first > 0:
        parts.append(_block("observation", "Before the first turn", tokens.completion(t, 0, first)))
    for k in range(max(len(spans), len(t.actions))):
        if k < len(spans):
            start, end = spans[k]
            next_start = spans[k + 1][0] if k + 1 < len(spans) else len(t.completion_ids)
            action_body, observation_body = tokens.completion(t, start, end), tokens.completion(t, end, next_start)
        else:
            action_body = observation_body = '<span class="none">(no tokens)</span>'
        action_text = _text_block(_item(t.actions, k), "action-text")
        observation_text = _text_block(_item(t.observations, k), "observation-text")
        plain = (
            '<details class="plain"><summary>plain text</summary>'
            f'<div class="label">action</div>{action_text}<div class="label">observation</div>{observation_text}'
            "</details>"
        )
        parts.append(
            f'<div class="turn">{_turn_head(t, k, extras)}'
            f'{_block("action", "Action (trained)", action_body)}{_item(calls, k) or ""}'
            f'{_block("observation", "Observation (masked)", observation_body)}{plain}</div>'
        )
    return "".join(parts)


def _legend(token_mode: bool) -> str:
    """What the styles mean, for the token view or the text view."""
    if token_mode:
        keys = (
            '<span class="key trained">sampled token: env_mask 1, trained</span>'
            '<span class="key masked">observation token: env_mask 0, masked</span>'
            '<span class="key prompt">prompt token: not trained</span>'
        )
        note = ("Each box is one token (↵ a newline, ∅ an empty decode); hover for its id, position and mask, and for "
                "a sampled token its log-prob.")
    else:
        keys = (
            '<span class="key trained">action: sampled by the model, trained</span>'
            '<span class="key masked">observation: appended by the environment, masked</span>'
        )
        note = "No tokenizer given: showing text; pass one to see the tokens and their mask."
    return f'<div class="legend"><strong>Legend</strong> {keys}<div class="label">{_esc(note)}</div></div>'


# The index table's columns: (header, cell of one trajectory); a column no trajectory fills is left out.
_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("training step", lambda t, extras: _esc(_fmt(extras["step"])) if "step" in extras else ""),
    ("reward (reward functions)", lambda t, extras: _esc(_fmt(extras["reward"])) if "reward" in extras else ""),
    ("turns", lambda t, extras: str(t.num_turns)),
    ("stop reason", lambda t, extras: _esc(t.stop_reason or "")),
    ("truncated", lambda t, extras: "yes" if t.truncated else ""),
)


def _index_cells(i: int, t: Trajectory, extras: dict[str, Any]) -> list[str]:
    """The cells of one trajectory's line of the index table (the link first, then one per ``_COLUMNS``)."""
    return [f'<a href="#traj-{i}">{i}</a>'] + [cell(t, extras) for _, cell in _COLUMNS]


def _index_table(rows: Sequence[tuple[str, ...]]) -> str:
    """The index table: a line per trajectory (a broken row: its link and its error across the line), and only the
    columns some trajectory fills."""
    full = [r for r in rows if len(r) == 1 + len(_COLUMNS)]
    shown = [k for k in range(len(_COLUMNS)) if any(r[1 + k] for r in full)]
    header = "".join(f"<th>{_esc(h)}</th>" for h in ["#", *(_COLUMNS[k][0] for k in shown)])
    lines = []
    for r in rows:
        if len(r) == 1 + len(_COLUMNS):
            cells = [r[0], *(r[1 + k] for k in shown)]
            lines.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        else:
            lines.append(f'<tr><td>{r[0]}</td><td colspan="{max(len(shown), 1)}">{r[1]}</td></tr>')
    return f'<table class="index"><tr>{header}</tr>{"".join(lines)}</table>'


def _section(i: int, t: Trajectory, extras: dict[str, Any], tokens: _TokenRenderer | None) -> str:
    """One trajectory: its header and its turns."""
    label = f"Trajectory {i}" + (f" · step {_fmt(extras['step'])}" if "step" in extras else "")
    return (
        f'<section class="traj" id="traj-{i}"><h2>{_esc(label)}</h2>'
        f"{_meta(t, extras)}{_render_turns(t, tokens, extras)}</section>"
    )


def _broken(i: int, exc: Exception) -> tuple[str, str]:
    """The index line (its cells: the link, then the error) and the section of a row that is no renderable
    trajectory: the error, shown."""
    error = f"{type(exc).__name__}: {exc}"
    row = f'<a href="#traj-{i}">{i}</a>', f'<span class="flag">{_esc(error)}</span>'
    section = (
        f'<section class="traj broken" id="traj-{i}"><h2>Trajectory {i}</h2>'
        f'<div class="flag">could not be rendered: {_esc(error)}</div></section>'
    )
    return row, section


def render_html(
    trajectories: Iterable[Trajectory | Mapping[str, Any]],
    processing_class: Any = None,
    title: str = "trl-agentic trajectories",
    max_trajectories: int | None = None,
    extras: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Render trajectories as a self-contained HTML page (inline CSS, no script, no network).

    Args:
        trajectories: ``Trajectory`` objects or rows from :func:`~trl_agentic.trajectory.load_trajectories`;
            extra row keys such as ``step`` and ``reward`` appear in each trajectory's header.
        processing_class: The policy's tokenizer (or processor). When given, every token is shown in its own box,
            styled by its ``env_mask`` (trained vs masked), with its id, position, mask and (sampled tokens) log-prob
            on hover; otherwise the text of the actions and observations is shown.
        title: Page title.
        max_trajectories: Render only the first this many trajectories (all when ``None``).
        extras: Per trajectory, keys shown as a row's extra keys are (``reward`` and ``step`` also as columns of
            the list), e.g. the rewards of ``Trajectory`` objects, which carry none.

    Returns:
        The HTML page. All text from trajectories is escaped (see the module docstring); a row that cannot be
        rendered gets a section showing the error instead.
    """
    rows = list(trajectories)
    total = len(rows)
    if max_trajectories is not None:
        rows = rows[:max_trajectories]
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    tokens = _TokenRenderer(tokenizer) if tokenizer is not None else None
    index_rows: list[tuple[str, ...]] = []
    sections = []
    for i, row in enumerate(rows):
        try:
            t, keys = _as_row(row)
            keys = {**keys, **extras[i]} if extras is not None else keys
            index_row, section = tuple(_index_cells(i, t, keys)), _section(i, t, keys, tokens)
        except Exception as exc:  # noqa: BLE001 - one bad row costs its own section, not the page
            index_row, section = _broken(i, exc)
        index_rows.append(index_row)
        sections.append(section)
    head = f"{len(rows)} trajector{'y' if len(rows) == 1 else 'ies'}"
    if total > len(rows):
        head += f" (first {len(rows)} of {total})"
    summary = f'<div class="summary"><strong>{_esc(head)}</strong>{_index_table(index_rows)}</div>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_plain(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1>{_legend(tokens is not None)}{summary}"
        f'{"".join(sections)}</body></html>\n'
    )


def _read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-blank line. A line that is not a JSON object is skipped with a
    warning naming ``path:line``; bytes that are not UTF-8 are kept as lone surrogates (shown escaped)."""
    with Path(path).open(encoding="utf-8", errors="surrogateescape") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                logger.warning("%s:%d: skipped: not valid JSON (%s at column %d)", path, line_no, exc.msg, exc.pos + 1)
                continue
            except RecursionError:
                logger.warning("%s:%d: skipped: JSON nested too deeply", path, line_no)
                continue
            problem = row_problem(row)
            if problem is not None:
                logger.warning("%s:%d: skipped: %s", path, line_no, problem)
                continue
            yield row


def main(argv: list[str] | None = None) -> Path:
    """Command line: render JSONL trajectories to an HTML file and print its path."""
    parser = argparse.ArgumentParser(
        prog="python -m trl_agentic.render",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trajectories", nargs="+", help="JSONL file(s) written by save_trajectories")
    parser.add_argument("-o", "--output", default=None, help="HTML file to write (default: the first input, .html)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer path or name, to show tokens and their mask")
    parser.add_argument("--max", type=int, default=None, help="render at most this many trajectories")
    parser.add_argument("--step", type=int, default=None, help="only trajectories of this training step")
    args = parser.parse_args(argv)
    for path in args.trajectories:
        if not Path(path).is_file():
            parser.error(f"{path} is not a file: pass a JSONL file written by save_trajectories")
    logging.basicConfig(format="%(levelname)s: %(message)s")

    rows = [row for path in args.trajectories for row in _read_rows(path)]
    if args.step is not None:
        rows = [row for row in rows if row.get("step") == args.step]
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    title = "trl-agentic trajectories: " + ", ".join(Path(p).name for p in args.trajectories)
    if args.step is not None:
        title += f" (step {args.step})"
    output = Path(args.output) if args.output else Path(args.trajectories[0]).with_suffix(".html")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_html(rows, tokenizer, title=title, max_trajectories=args.max), encoding="utf-8")
    print(output)
    return output


if __name__ == "__main__":
    main()
