"""Question-answering verifiers: exact match and token F1 with SQuAD-style normalization.

Normalization (SQuAD v1.1 evaluation script, Rajpurkar et al. 2016): lowercase, remove punctuation, remove the
articles *a*, *an*, *the*, collapse whitespace. With several gold answers the score is the maximum over them.

Token F1 between prediction tokens ``P`` and gold tokens ``G`` (after normalization), with ``c`` the size of their
multiset intersection: precision ``c/|P|``, recall ``c/|G|``, ``F1 = 2 * precision * recall / (precision + recall)``
(0 when ``c = 0`` or when the prediction is empty).

Gold answers that normalise to the empty string (``"the"``, ``"a"``, ``"."``, ``""``) are unusable and ignored: the
SQuAD script would score them 1.0 against an empty prediction, so a model answering ``<answer>.</answer>`` would be
rewarded whenever a dataset row carries such a gold. A row left without a usable gold scores 0.0 for every
prediction (its reward cannot be raised by any answer, so it carries no signal rather than a wrong one).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from ...environments.tag_protocol import SEARCH_R1_TAGS, TagProtocol
from ..base import RewardFunction, Sample, golds_as_list
from ..text import last_block

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, strip punctuation, drop articles, collapse whitespace."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def usable_golds(golds: str | Sequence[str] | None) -> list[str]:
    """The normalized gold answers, without those that normalize to the empty string (see the module docstring)."""
    return [gold for gold in map(normalize_answer, golds_as_list(golds)) if gold]


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when the normalized prediction equals any usable normalized gold answer, else 0.0 (also for no
    prediction and for no usable gold)."""
    if prediction is None:
        return 0.0
    normalized = normalize_answer(prediction)
    return float(any(normalized == gold for gold in usable_golds(golds)))


def _f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    common = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(prediction_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Maximum SQuAD token F1 of the prediction against the usable gold answers (0.0 for no prediction, an empty
    one, or no usable gold)."""
    if prediction is None:
        return 0.0
    tokens = normalize_answer(prediction).split()
    return max((_f1(tokens, gold.split()) for gold in usable_golds(golds)), default=0.0)


class QAReward(RewardFunction):
    """Outcome reward for open-domain QA: exact match (``metric="em"``) or token F1 (``metric="f1"``) of the
    model's last ``<answer>`` block against the gold answers; 0.0 when there is no answer block.

    The answer is read from the completion only, from the model's own text (observations never count). Search-R1
    (arXiv 2503.09516) instead counted ``<answer>`` tags over prompt + response and required two, because its prompt
    shows one example ``<answer>`` tag; reading the completion alone, one tag suffices.

    Args:
        metric: ``"em"`` or ``"f1"``.
        answer_column: Dataset column(s) with the gold answers, first present used (Search-R1: ``golden_answers``,
            a list; a string or a ``{"target": [...]}`` mapping also works).
        protocol: The tag protocol: its answer tag holds the answer, and its observation tags are stripped before
            extraction when there is no trajectory (default: Search-R1's).
        name: ``__name__``; defaults to ``qa_em`` / ``qa_f1``.
    """

    def __init__(
        self,
        metric: Literal["em", "f1"] = "em",
        answer_column: str | Sequence[str] = ("golden_answers", "answer"),
        protocol: TagProtocol = SEARCH_R1_TAGS,
        name: str | None = None,
    ) -> None:
        if metric not in ("em", "f1"):
            raise ValueError(f"metric must be 'em' or 'f1', got {metric!r}")
        super().__init__(name or f"qa_{metric}")
        self.metric = metric
        self.answer_column = answer_column
        self.protocol = protocol

    def score(self, sample: Sample) -> float:
        answer = last_block(sample.model_text(self.protocol.observation_tags), self.protocol.answer)
        golds = golds_as_list(sample.column(self.answer_column))
        return exact_match(answer, golds) if self.metric == "em" else token_f1(answer, golds)
