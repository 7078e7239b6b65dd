import re

import pytest

from trl_agentic.environments.tag_protocol import TagProtocol
from trl_agentic.rewards import RETOOL_TAGS, SEARCH_R1_TAGS, FormatReward, check_format


def search_r1_is_valid(text: str) -> bool:
    """Test oracle: the rule of Search-R1 v0.3's ``is_valid_sequence`` (applied to the response), written
    independently: balanced tags; tags in the order think -> (search -> information -> think)* -> answer; only
    whitespace outside tags; the sequence ends after the answer."""
    names = ["think", "search", "information", "answer"]
    for name in names:
        if text.count(f"<{name}>") != text.count(f"</{name}>"):
            return False
    allowed = {
        "start": {"<think>": "in_think"},
        "in_think": {"</think>": "after_think"},
        "after_think": {"<search>": "in_search", "<answer>": "in_answer"},
        "in_search": {"</search>": "after_search"},
        "after_search": {"<information>": "in_information"},
        "in_information": {"</information>": "information"},
        "information": {"<think>": "in_think"},
        "in_answer": {"</answer>": "end"},
    }
    state = "start"
    for part in re.split(r"(</?(?:think|search|information|answer)>)", text):
        if not part.strip():
            continue
        if re.fullmatch(r"</?(?:think|search|information|answer)>", part):
            state = allowed.get(state, {}).get(part)
            if state is None:
                return False
        elif not state.startswith("in_"):
            return False
    return state == "end"


VALID = "<think>need data</think><search>capital of France</search>\n\n<information>Doc 1 Paris</information>\n\n" \
        "<think>it is Paris</think>\n<answer>Paris</answer>"

CASES = [
    VALID,
    "<think>easy</think><answer>4</answer>",
    "  <think>a</think>  <answer>4</answer>  ",
    "<think>a</think><answer>4</answer> trailing words",
    "preamble <think>a</think><answer>4</answer>",
    "<think>a</think> between <answer>4</answer>",
    "<answer>4</answer>",
    "<think>a</think><search>q</search><answer>4</answer>",
    "<think>a</think><search>q</search><information>d</information><answer>4</answer>",
    "<think>a</think><think>b</think><answer>4</answer>",
    "<think>a</think><answer>4</answer><answer>5</answer>",
    "<think>a<answer>4</answer></think>",
    "<think>a</think><search>q</search><information>d</information>",
    "<think>a</think><answer>4",
    "<think>a</think></answer>",
    "just text",
    "",
    "<think>a</think><search>q</search><information>d <answer>x</answer></information><think>b</think><answer>4</answer>",
]


@pytest.mark.parametrize("text", CASES)
def test_valid_exactly_when_search_r1_says_so(text):
    report = check_format(text, SEARCH_R1_TAGS)
    assert report.valid == search_r1_is_valid(text)
    assert (report.score == 1.0) == report.valid
    assert 0.0 <= report.score <= 1.0
    assert report.valid == (report.error == "")


def test_partial_credit():
    full = check_format(VALID)
    assert (full.balanced, full.order, full.clean, full.answer, full.score) == (1, 1, 1, 1, 1)
    truncated = check_format("<think>a</think><search>q</search><information>d</information>")
    assert truncated.score == pytest.approx(0.75)  # everything but the final answer
    stray = check_format("<think>a</think> chatter <answer>4</answer>")
    # outside gaps: before <think>, after </think>, after </answer>; one of three holds text
    assert stray.clean == pytest.approx(2 / 3)
    assert stray.score == pytest.approx((1 + 1 + 2 / 3 + 1) / 4)
    unbalanced = check_format("<think>a<answer>4</answer>")
    assert unbalanced.balanced == pytest.approx(0.5)  # think unbalanced, answer balanced
    assert unbalanced.order == pytest.approx(1 / 3)  # <think> accepted, then <answer> inside think is not
    assert check_format("just text").score == 0.0
    assert check_format("<think>a</think>").score < check_format("<think>a</think><answer>4</answer>").score


def test_retool_spec_allows_free_reasoning():
    text = "Let me compute.\n<code>print(6*7)</code>\n<interpreter>42</interpreter>\nSo it is 42.\n" \
           "<answer>\\boxed{42}</answer>"
    assert check_format(text, RETOOL_TAGS).valid
    assert not check_format("<code>x</code> oops <interpreter>1</interpreter><answer>1</answer>", RETOOL_TAGS).valid
    assert not check_format("<answer>1</answer> more", RETOOL_TAGS).valid


def test_multiple_tools_and_custom_tags():
    spec = TagProtocol(think="reason", tools={"search": "information", "code": "interpreter"}, answer="final")
    text = "<reason>a</reason><search>q</search><information>d</information><reason>b</reason>" \
           "<code>1+1</code><interpreter>2</interpreter><reason>c</reason><final>2</final>"
    assert check_format(text, spec).valid
    wrong_observation = text.replace("<interpreter>2</interpreter>", "<information>2</information>")
    assert not check_format(wrong_observation, spec).valid


def test_format_reward_uses_observations_from_trajectory(trajectory):
    reward = FormatReward()
    traj = trajectory(
        ["<think>need data</think><search>capital of France</search>", "<think>Paris</think><answer>Paris</answer>"],
        ["\n\n<information>Doc 1 Paris</information>\n\n", None],
    )
    assert reward(prompts=["q"], completions=["unused"], trajectory=[traj]) == [1.0]
    assert reward(prompts=["q", "q"], completions=[VALID, "Paris"]) == [1.0, 0.0]
    assert reward.__name__ == "format"
