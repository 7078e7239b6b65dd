"""The HTML renderer against hostile text and files: lone surrogates and bidi controls in any text field are shown
escaped (never raised, never written raw), and a malformed JSONL line (not JSON, or
not a trajectory) is skipped with a warning naming its line and field."""

from __future__ import annotations

import json
import logging
import re
from html.parser import HTMLParser

import pytest

from trl_agentic.render import main, render_html
from trl_agentic.trajectory import Trajectory

# Unicode Bidi_Control characters: they reorder the text around them ("Trojan Source", CVE-2021-42574).
BIDI = [
    "\u061c",
    "\u200e",
    "\u200f",
    "\u202a",
    "\u202b",
    "\u202c",
    "\u202d",
    "\u202e",
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
]
SURROGATES = ["\ud800", "\udbff", "\udc80", "\udfff"]
RAW = re.compile("[\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _hostile(i: int) -> str:
    return f"a{SURROGATES[i % 4]}b{BIDI[i % len(BIDI)]}c{BIDI[(i + 5) % len(BIDI)]}d"


def _trajectory(tokenizer=None) -> Trajectory:
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if tokenizer else [1, 2, 3]

    action, observation = "<answer>safe\u202e</answer>", "<information>evil\ud800</information>"
    t = Trajectory(prompt_ids=encode("question"), prompt=[{"role": "user", "content": _hostile(0)}])
    t.completion_ids = encode("answer") + encode("obs")
    t.env_mask = [1] * len(encode("answer")) + [0] * len(encode("obs"))
    t.turn_spans = [(0, len(encode("answer")))]
    t.actions, t.observations = [action + _hostile(1)], [observation + _hostile(2)]
    t.turn_rewards, t.turn_infos = [1.0], [{"tool": _hostile(3), _hostile(4): 1}]
    t.stop_reason = _hostile(5)
    t.events = {_hostile(6): 2}
    return t


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _visible(page: str) -> str:
    parser = _Text()
    parser.feed(page)
    return "".join(parser.text)


def _check_page(page: str) -> None:
    page.encode("utf-8")  # strict: a lone surrogate would raise here (and when the CLI writes the file)
    assert not RAW.search(page), [hex(ord(c)) for c in RAW.findall(page)][:5]
    text = _visible(page)
    for ch in SURROGATES:
        assert f"\\u{ord(ch):04x}" in text
    for ch in BIDI:
        assert f"U+{ord(ch):04X}" in text


@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_surrogates_and_bidi_controls_are_shown_escaped(tokenizer, with_tokenizer):
    t = _trajectory(tokenizer if with_tokenizer else None)
    row = {**t.to_dict(), "step": _hostile(7), "reward": 1.0, "note": _hostile(8)}
    page = render_html([row], tokenizer if with_tokenizer else None, title="title " + _hostile(9))
    _check_page(page)
    assert page.count('<section class="traj"') == 1
    title = re.search("<title>(.*?)</title>", page, re.S).group(1)
    assert "<span" not in title and "U+" in title  # plain-text escapes where markup is not allowed


def _line(row: dict) -> bytes:
    return json.dumps(row).encode() + b"\n"  # ensure_ascii: lone surrogates travel as \\ud800 escapes


def test_cli_skips_malformed_lines_and_names_them(tmp_path, caplog, capsys):
    good = Trajectory(prompt_ids=[1], actions=["<answer>ok</answer>"], observations=[None], stop_reason="done")
    hostile = _trajectory()
    lines = [
        _line(good.to_dict()),  # 1
        b'{"prompt_ids": [1, 2\n',  # 2: truncated JSON
        b"\n",  # 3: blank, ignored
        b"[1, 2]\n",  # 4: JSON, but not an object
        _line(hostile.to_dict()),  # 5: surrogates and bidi controls as JSON escapes
        b'{"prompt_ids": [], "prompt": "caf\xff\xfe", "actions": ["x"]}\n',  # 6: bytes that are not UTF-8
        b'{"prompt_ids": [1], "actions": 3}\n',  # 7: an object that is no trajectory
        b'{"completion_ids": [1, 2], "env_mask": [1, 1]}\n',  # 8: no prompt_ids
        b'{"prompt_ids": "abc", "completion_ids": [1], "env_mask": [1]}\n',  # 9: a string of ids
        b'{"prompt_ids": [1], "completion_ids": [1, 2], "env_mask": [1]}\n',  # 10: mask and ids differ in length
        b"not json at all",  # 11: no newline at the end of the file
    ]
    path = tmp_path / "trajectories.jsonl"
    path.write_bytes(b"".join(lines))
    out = tmp_path / "page.html"
    with caplog.at_level(logging.WARNING):
        assert main([str(path), "-o", str(out)]) == out
    warned = "\n".join(r.getMessage() for r in caplog.records)
    for line_no in (2, 4, 7, 8, 9, 10, 11):
        assert f"{path}:{line_no}:" in warned
    assert f"{path}:7: skipped: field 'actions' must be a list of strings, got 3" in warned
    assert f"{path}:8: skipped: field 'prompt_ids' is missing" in warned
    assert f"{path}:9: skipped: field 'prompt_ids' must be a list of integers" in warned
    assert f"{path}:10: skipped: field 'env_mask' must be as long as 'completion_ids'" in warned
    assert f"{path}:3:" not in warned and f"{path}:5:" not in warned and f"{path}:6:" not in warned
    page = out.read_text(encoding="utf-8")
    _check_page(page)
    # lines 1, 5, 6 render; the others are skipped, each with its warning
    assert page.count('<section class="traj') == 3
    assert "could not be rendered" not in page and "\\udcff" in _visible(page)
