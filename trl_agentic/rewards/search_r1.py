"""Search-R1 v0.3's outcome-plus-format reward (PeterGriffinJin/Search-R1, ``verl/utils/reward_score/
qa_em_format.py``, ``compute_score_em``), as one TRL reward function.

With ``s = score`` (1.0), ``f = structure_format_score`` (0.2 in the v0.3 training scripts), ``b =
final_format_score`` (0.1) and ``g = retrieval_score`` (0 in those scripts), "valid" meaning the completion
follows the protocol exactly (:func:`~trl_agentic.rewards.format.check_format`) and "retrieved" meaning a
normalized gold answer appears inside some ``<information>`` block of a valid completion (golds that normalize to the
empty string are ignored, as in :mod:`~trl_agentic.rewards.verifiers.qa`):

==================  ===========================  ========================
answer              valid format                 invalid format
==================  ===========================  ========================
exact match         ``s`` (1.0)                  ``s - f`` (0.8)
wrong               ``f`` (+ ``g`` if retrieved)  ``b`` (0.1)
none                ``f`` (+ ``g`` if retrieved)  0
==================  ===========================  ========================

Setting ``structure_format_score = final_format_score = 0`` gives plain exact match (Search-R1's validation
reward). Unlike the original, which read prompt + response and so needed two ``<answer>`` tags, the answer is the
last ``<answer>`` block of the model's own completion text (observations never count), and the format is checked
over the completion (model text and observations).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..environments.tag_protocol import SEARCH_R1_TAGS, TagProtocol
from .base import RewardFunction, Sample, golds_as_list
from .format import check_format
from .text import find_blocks, last_block
from .verifiers.qa import exact_match, normalize_answer, usable_golds


class SearchR1Reward(RewardFunction):
    """Search-R1 v0.3 reward (table in the module docstring).

    Args:
        answer_column: Dataset column(s) with the gold answers (Search-R1: ``golden_answers``).
        score: Reward for a correct answer with valid format.
        structure_format_score: ``f`` in the table.
        final_format_score: ``b`` in the table.
        retrieval_score: ``g`` in the table.
        protocol: The tag protocol (Search-R1's by default).
        name: ``__name__`` (metric name in TRL).
    """

    def __init__(
        self,
        answer_column: str | Sequence[str] = ("golden_answers", "answer"),
        score: float = 1.0,
        structure_format_score: float = 0.2,
        final_format_score: float = 0.1,
        retrieval_score: float = 0.0,
        protocol: TagProtocol = SEARCH_R1_TAGS,
        name: str = "search_r1",
    ) -> None:
        super().__init__(name)
        self.answer_column = answer_column
        self.correct_score = score
        self.structure_format_score = structure_format_score
        self.final_format_score = final_format_score
        self.retrieval_score = retrieval_score
        self.protocol = protocol

    def _retrieved(self, text: str, golds: list[str]) -> bool:
        blocks = [normalize_answer(b) for tag in self.protocol.observation_tags for b in find_blocks(text, tag)]
        return any(gold in block for gold in usable_golds(golds) for block in blocks)

    def score(self, sample: Sample) -> float:
        text = sample.text
        valid = check_format(text, self.protocol).valid
        golds = golds_as_list(sample.column(self.answer_column))
        answer = last_block(sample.model_text(self.protocol.observation_tags), self.protocol.answer)
        if answer is not None and exact_match(answer, golds):
            return self.correct_score if valid else self.correct_score - self.structure_format_score
        if valid:
            bonus = self.retrieval_score if self.retrieval_score and self._retrieved(text, golds) else 0.0
            return self.structure_format_score + bonus
        return self.final_format_score if answer is not None else 0.0
