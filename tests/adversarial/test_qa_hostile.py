"""QA rewards against gold answers that normalise to nothing ("the", "a", ".", ""): such a gold is unusable and
must never reward an empty (or any) answer, nor count as found in a retrieved passage."""

from __future__ import annotations

import pytest

from trl_agentic.rewards import QAReward, SearchR1Reward, exact_match, token_f1

EMPTY_GOLDS = ["the", "a", ".", "", "  ", "An!", "?!"]


@pytest.mark.parametrize("gold", EMPTY_GOLDS)
@pytest.mark.parametrize("prediction", ["", "the", ".", "Paris", "anything at all"])
def test_empty_normalised_gold_matches_nothing(gold, prediction):
    assert exact_match(prediction, [gold]) == 0.0
    assert token_f1(prediction, [gold]) == 0.0


def test_empty_gold_is_ignored_and_usable_golds_still_count():
    golds = ["the", "", "Paris"]
    assert exact_match("Paris", golds) == 1.0 and token_f1("Paris", golds) == 1.0
    assert exact_match("the", golds) == 0.0 and token_f1(".", golds) == 0.0
    assert token_f1("Paris France", golds) == pytest.approx(2 / 3)


@pytest.mark.parametrize("metric", ["em", "f1"])
def test_qa_reward_gives_nothing_for_empty_answers_against_empty_golds(metric):
    reward = QAReward(metric=metric)
    completions = ["<answer></answer>", "<answer>.</answer>", "<answer>the</answer>", "<answer>Paris</answer>"]
    scores = reward(prompts=["q"] * 4, completions=completions, golden_answers=[["the", "."]] * 4)
    assert scores == [0.0, 0.0, 0.0, 0.0]
    scores = reward(prompts=["q"] * 4, completions=completions, golden_answers=[["a", "Paris"]] * 4)
    assert scores == [0.0, 0.0, 0.0, 1.0]


def test_search_r1_retrieval_bonus_needs_a_usable_gold():
    reward = SearchR1Reward(retrieval_score=0.5)
    valid = (
        "<think>x</think><search>q</search>\n\n<information>Doc 1(Title: Lyon) Lyon is a city.</information>\n\n"
        "<think>y</think><answer>Lyon</answer>"
    )
    # an empty-normalised gold is "contained" in every passage: it must not earn the retrieval bonus
    assert reward(prompts=["q"], completions=[valid], golden_answers=[["the"]]) == [0.2]
    assert reward(prompts=["q"], completions=[valid], golden_answers=[["a city", "the"]]) == [0.2 + 0.5]
