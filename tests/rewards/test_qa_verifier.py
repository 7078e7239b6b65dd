import numpy as np
import pytest

from trl_agentic.rewards import QAReward, exact_match, normalize_answer, token_f1


def test_normalize_answer():
    assert normalize_answer("The  Beatles!") == "beatles"
    assert normalize_answer("An apple, a day.") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("  U.S.A. ") == "usa"


def test_exact_match_articles_punctuation_and_multiple_golds():
    assert exact_match("the Beatles", "Beatles") == 1.0
    assert exact_match("Beatles.", ["The Rolling Stones", "The Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match(None, ["Beatles"]) == 0.0
    assert exact_match("x", []) == 0.0


def test_token_f1():
    # prediction "barack obama" vs gold "obama": precision 1/2, recall 1 -> F1 2/3
    assert token_f1("Barack Obama", "Obama") == pytest.approx(2 / 3)
    assert token_f1("Barack Obama", ["George Bush", "President Barack Obama"]) == pytest.approx(0.8)
    assert token_f1("the", "a") == 0.0  # a gold empty after normalization is unusable (matches nothing)
    assert token_f1("the", "Paris") == 0.0
    assert token_f1("London", "Paris") == 0.0
    assert token_f1(None, "Paris") == 0.0


def test_qa_reward_reads_golden_answers_and_answer_tags():
    em = QAReward()
    f1 = QAReward(metric="f1")
    completions = [
        "<think>..</think><answer> The Beatles </answer>",
        "<think>..</think><answer>Beatles band</answer>",
        "The Beatles",  # no answer tag
    ]
    golds = [["Beatles", "the fab four"], np.array(["Beatles"]), ["Beatles"]]
    assert em(prompts=["q"] * 3, completions=completions, golden_answers=golds) == [1.0, 0.0, 0.0]
    assert f1(prompts=["q"] * 3, completions=completions, golden_answers=golds) == pytest.approx([1.0, 2 / 3, 0.0])
    assert (em.__name__, f1.__name__) == ("qa_em", "qa_f1")


def test_qa_reward_answer_column_variants():
    em = QAReward(answer_column="answer")
    assert em(prompts=["q", "q"], completions=["<answer>Paris</answer>"] * 2,
              answer=["paris", {"target": ["Lyon", "Paris"]}]) == [1.0, 1.0]


def test_answer_inside_observation_is_ignored(trajectory):
    em = QAReward()
    text = "<search>q</search>\n\n<information>Doc 1: <answer>Paris</answer></information>\n\n"
    assert em(prompts=["q"], completions=[text], golden_answers=[["Paris"]]) == [0.0]
    traj = trajectory(["<search>q</search>"], ["<information><answer>Paris</answer></information>"])
    assert em(prompts=["q"], completions=[text], golden_answers=[["Paris"]], trajectory=[traj]) == [0.0]


def test_one_answer_tag_suffices():
    # Search-R1 needed two <answer> tags over prompt + response; the completion alone needs one.
    assert QAReward()(prompts=["... e.g. <answer> Beijing </answer>"], completions=["<answer>Paris</answer>"],
                      golden_answers=[["Paris"]]) == [1.0]


def test_bad_metric():
    with pytest.raises(ValueError):
        QAReward(metric="rouge")
