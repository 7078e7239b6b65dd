"""The HTML trajectory renderer: escaping, token classes that match the env mask, dict rows and objects, the CLI."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest

from trl_agentic.render import main, render_html
from trl_agentic.trajectory import Trajectory, load_trajectories, save_trajectories

ACTIONS = ['<search>who wrote "Dune" & why?</search>', "<answer>Frank Herbert</answer>"]
OBSERVATIONS = ["<information>Doc 1: <b>Dune</b> (1965) by Frank Herbert & 'co'</information>", None]


class _Tokens(HTMLParser):
    """Collects the class list and title of every token ``<span class="tok ...">``."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[tuple[set[str], str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = set((attributes.get("class") or "").split())
        if tag == "span" and "tok" in classes:
            self.tokens.append((classes, attributes.get("title") or ""))


def _tokens(page: str) -> list[tuple[set[str], str]]:
    parser = _Tokens()
    parser.feed(page)
    return parser.tokens


def _trajectory(tokenizer) -> Trajectory:
    """A two-turn search episode laid out as the rollout engine does (text mode)."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    t = Trajectory(prompt_ids=encode("question: who wrote Dune?\n"), prompt="question: who wrote Dune?\n")
    for action, observation in zip(ACTIONS, OBSERVATIONS):
        ids = encode(action)
        start = len(t.completion_ids)
        t.completion_ids += ids
        t.env_mask += [1] * len(ids)
        t.logprobs += [-0.25] * len(ids)
        t.turn_spans.append((start, start + len(ids)))
        t.actions.append(action)
        t.turn_rewards.append(0.5)
        t.turn_infos.append({"tool": ["search"]})
        t.observations.append(observation)
        if observation is not None:
            obs_ids = encode(observation)
            t.completion_ids += obs_ids
            t.env_mask += [0] * len(obs_ids)
            t.logprobs += [0.0] * len(obs_ids)
    t.stop_reason = "terminated"
    t.count("observation_truncated")
    return t


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_actions_and_observations_are_escaped(tokenizer, with_tokenizer):
    t = _trajectory(tokenizer)
    page = render_html([t], processing_class=tokenizer if with_tokenizer else None)
    for action in ACTIONS:
        assert html.escape(action) in page
    assert html.escape(OBSERVATIONS[0]) in page
    # No raw markup from the trajectory survives: only the page's own tags, and never a trajectory tag.
    for raw in ("<information>", "</information>", "<search>", "<answer>", "<b>"):
        assert raw not in page
    assert "&lt;information&gt;" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_native_tool_calls_and_results_are_shown_escaped(tokenizer, with_tokenizer):
    """Each turn lists its parsed calls with their results (two calls in one turn, then a call the parser could not
    read); the model's and the tools' text stays text."""
    t = _trajectory(tokenizer)
    t.messages = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "<script>x</script>"}}},
            {"type": "function", "function": {"name": "lookup", "arguments": {"id": 3}}}]},
        {"role": "tool", "name": "search", "content": "<b>Paris</b>"},
        {"role": "tool", "name": "lookup", "content": "{'error': 'Tool lookup not found.'}"},
        {"role": "assistant", "content": "<tool_call>{bad"},
        {"role": "tool", "name": "unknown", "content": "{'error': 'could not parse the tool call'}"},
    ]
    page = render_html([t], processing_class=tokenizer if with_tokenizer else None)
    items = re.findall(r'<ol class="calls">(.*?)</ol>', page)
    assert items == [
        "<li>search({&quot;query&quot;: &quot;&lt;script&gt;x&lt;/script&gt;&quot;}) → &lt;b&gt;Paris&lt;/b&gt;</li>"
        "<li>lookup({&quot;id&quot;: 3}) → {&#x27;error&#x27;: &#x27;Tool lookup not found.&#x27;}</li>",
        "<li>(a call the parser could not read) → {&#x27;error&#x27;: &#x27;could not parse the tool call&#x27;}</li>",
    ]
    assert "<script" not in page and "<b>" not in page


def test_token_classes_match_env_mask(tokenizer):
    t = _trajectory(tokenizer)
    tokens = _tokens(render_html([t], processing_class=tokenizer))
    completion = [classes for classes, _ in tokens if "prompt" not in classes]
    assert sum("trained" in c for c in completion) == sum(t.env_mask) > 0
    assert sum("masked" in c for c in completion) == len(t.env_mask) - sum(t.env_mask) > 0
    assert not any({"trained", "masked"} <= c for c in completion)
    assert sum("prompt" in c for c, _ in tokens) == len(t.prompt_ids)
    # Completion tokens appear in order, each class agreeing with the mask at its position, with a full tooltip.
    assert len(completion) == len(t.completion_ids)
    titles = [title for classes, title in tokens if "prompt" not in classes]
    for pos, (classes, title) in enumerate(zip(completion, titles)):
        assert ("trained" if t.env_mask[pos] else "masked") in classes
        assert f"id {t.completion_ids[pos]} " in title and f"position {pos} " in title
        assert f"(env_mask {t.env_mask[pos]})" in title
        if t.env_mask[pos]:  # a sampled token shows the log-prob the generator reported
            assert title.endswith(f"sampled, trained (env_mask 1) · log-prob {t.logprobs[pos]:.4g}")
        else:  # an observation token was not sampled: no log-prob at all (its 0.0 is a placeholder)
            assert title.endswith("observation, masked (env_mask 0)") and "log-prob" not in title


def test_unknown_log_probs_are_not_shown_as_numbers(tokenizer):
    """A generator that reports no log-prob (the trainer's transformers path, sampled evaluation) leaves ``None``:
    the page says so, and never shows 0.0000 for a sampled token."""
    t = _trajectory(tokenizer)
    t.logprobs = [None if m else 0.0 for m in t.env_mask]
    titles = [title for classes, title in _tokens(render_html([t], processing_class=tokenizer))
              if "prompt" not in classes]
    assert len(titles) == len(t.completion_ids)  # every token rendered (the row did not fail)
    assert all("log-prob not recorded" in title for title, m in zip(titles, t.env_mask) if m)
    assert not any(re.search(r"log-?prob -?0\.0000", title) for title in titles)


def test_numbers_are_labelled_and_empty_columns_hidden(tokenizer):
    """Each number says what it is: the reward functions' reward, the environment's step rewards only when it gives
    any; the index has no column that no trajectory fills; masked tokens are not struck through."""
    t = _trajectory(tokenizer)
    t.turn_rewards = [0.0, 0.0]  # what most environments give: no step reward
    page = render_html([{**t.to_dict(), "reward": 1.0}], processing_class=tokenizer)
    assert "reward (reward functions)</dt><dd>1<" in page
    assert "env reward" not in page and "environment reward" not in page and "step reward" not in page
    header = re.search(r'<table class="index"><tr>(.*?)</tr>', page).group(1)
    assert re.findall(r"<th>(.*?)</th>", header) == ["#", "reward (reward functions)", "turns", "stop reason"]
    assert "line-through" not in page
    masked = re.search(r"\.masked \{([^}]*)\}", page).group(1)
    assert "dashed" in masked and "text-decoration" not in masked

    t.turn_rewards = [0.5, 0.0]  # an environment that rewards steps: its numbers, labelled
    t.stop_reason = "max_turns"
    page = render_html([{**t.to_dict(), "step": 3}, t.to_dict()], processing_class=tokenizer)
    assert "environment reward (sum of step rewards)</dt><dd>0.5<" in page
    assert "Turn 1 · step reward (environment) 0.5" in page and "Turn 2 · step reward (environment) 0" in page
    assert 'truncated</dt><dd class="flag">yes' in page
    header = re.search(r'<table class="index"><tr>(.*?)</tr>', page).group(1)
    assert re.findall(r"<th>(.*?)</th>", header) == ["#", "training step", "turns", "stop reason", "truncated"]


def test_text_mode_has_no_tokens_and_shows_the_header(tokenizer):
    t = _trajectory(tokenizer)
    page = render_html([{**t.to_dict(), "step": 7, "reward": 0.75, "group": "a<b"}])
    assert _tokens(page) == []
    for fragment in (
        "training step</dt><dd>7<",
        "reward (reward functions)</dt><dd>0.75<",
        "environment reward (sum of step rewards)</dt><dd>1<",
        "turns</dt><dd>2<",
        "stop reason</dt><dd>terminated<",
        f"agent tokens (trained)</dt><dd>{sum(t.env_mask)}<",
        f"observation tokens (masked)</dt><dd>{len(t.env_mask) - sum(t.env_mask)}<",
        'events</dt><dd class="flag">observation_truncated×1<',
        "group</dt><dd>a&lt;b<",
    ):
        assert fragment in page
    assert "num_turns" not in page and "Legend" in page and "truncated</dt>" not in page  # not truncated: no line


def test_dict_rows_and_objects_render_the_same(tokenizer, tmp_path):
    t = _trajectory(tokenizer)
    path = tmp_path / "trajectories.jsonl"
    save_trajectories([t], path)
    (row,) = load_trajectories(path)
    for with_tokenizer in (tokenizer, None):
        assert render_html([row], processing_class=with_tokenizer) == render_html([t], processing_class=with_tokenizer)


def test_real_rollouts_and_max_trajectories(tokenizer, tiny_model):
    from trl_agentic import run_rollouts
    from trl_agentic.toy import LookupEnvironment, make_lookup_dataset

    trajectories = run_rollouts(
        tiny_model, tokenizer, LookupEnvironment, make_lookup_dataset(3),
        max_turns=3, max_tokens_per_turn=8, max_completion_length=40,
    )
    page = render_html(trajectories, processing_class=tokenizer, max_trajectories=2)
    assert page.count('<section class="traj"') == 2 and "first 2 of 3" in page
    classes = [c for c, _ in _tokens(page) if "prompt" not in c]
    shown = trajectories[:2]
    assert sum("trained" in c for c in classes) == sum(sum(t.env_mask) for t in shown)
    assert sum("masked" in c for c in classes) == sum(len(t.env_mask) - sum(t.env_mask) for t in shown)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", page)  # control characters are shown as symbols


def test_cli_writes_the_page(tokenizer, tmp_path, capsys):
    t = _trajectory(tokenizer)
    path = tmp_path / "trajectories-rank0.jsonl"
    save_trajectories([t, t], path, extra={"step": 1})
    save_trajectories([t], path, extra={"step": 2, "reward": 1.0})
    tokenizer_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tokenizer_dir)

    out = tmp_path / "html" / "page.html"
    written = main([str(path), "-o", str(out), "--tokenizer", str(tokenizer_dir), "--step", "2"])
    assert written == out and capsys.readouterr().out.strip() == str(out)
    page = out.read_text(encoding="utf-8")
    assert page.count('<section class="traj"') == 1 and "step 2" in page and _tokens(page)

    default = main([str(path), "--max", "2"])
    assert default == path.with_suffix(".html")
    page = default.read_text(encoding="utf-8")
    assert page.count('<section class="traj"') == 2 and "first 2 of 3" in page and not _tokens(page)
