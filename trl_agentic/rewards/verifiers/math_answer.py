r"""Math answer verification through `math-verify <https://github.com/huggingface/Math-Verify>`_.

Extraction rule for the model's final answer (:func:`extract_answer`), applied to the model's own text only
(observations never count), trying ``sources`` in order:

1. ``"answer"``: the content of the last ``<answer>...</answer>`` block;
2. ``"boxed"``: the content of the last ``\boxed{...}``;
3. ``"number"``: the last number in the text.

Strict modes drop later sources, e.g. ``sources=("answer",)`` rewards only a tagged answer.

Equivalence (:func:`math_equal`) parses both sides with math-verify and compares them symbolically (numbers, fractions,
LaTeX, sets, intervals, percentages, units stripped), after light normalization: thousands separators removed
(``1,000`` = ``1000``), escaped dollar signs dropped (``\$18.00`` = ``18``), ``\dfrac``/``\tfrac`` read as
``\frac``, and LaTeX (a backslash, brace, ``^`` or ``_``) without math delimiters wrapped in ``$...$`` (bare,
math-verify reads ``2^{10}`` as 2). A GSM8K gold solution is reduced to the text after its last ``####``
(:func:`extract_gold`).

math-verify is an optional dependency (``pip install trl-agentic[math]``), imported on first use.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from ...environments.tag_protocol import ANY_TOOL_TAGS, TagProtocol
from ..base import RewardFunction, Sample, golds_as_list
from ..text import last_block, last_boxed, last_number
from .deadline import DeadlineExceeded, DeadlinePool, WorkerFailed

ANSWER_SOURCES: tuple[str, ...] = ("answer", "boxed", "number")
"""The default extraction order: last ``<answer>`` block, else last ``\\boxed{}``, else last number."""

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_MATH_DELIMITERS = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
# Without delimiters math-verify reads ``2^{10}`` as 2; such text is parsed as LaTeX instead.
_LATEX_MARKERS = re.compile(r"[\\{}^_]")


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as err:  # pragma: no cover - exercised only without the extra installed
        raise ImportError(
            "math answer verification needs math-verify: pip install trl-agentic[math]"
        ) from err
    return math_verify


def extract_answer(text: str, sources: Sequence[str] = ANSWER_SOURCES, answer_tag: str = "answer") -> str | None:
    r"""The model's final answer in ``text``: the first source in ``sources`` that finds one (``"answer"``: last
    ``<answer_tag>`` block; ``"boxed"``: last ``\boxed{}``; ``"number"``: last number); ``None`` when none does.
    Pass the model's own text (see :meth:`~trl_agentic.rewards.base.Sample.model_text`)."""
    finders = {
        "answer": lambda t: last_block(t, answer_tag),
        "boxed": last_boxed,
        "number": last_number,
    }
    unknown = set(sources) - set(finders)
    if unknown:
        raise ValueError(f"unknown answer sources {sorted(unknown)}; choose from {list(finders)}")
    for source in sources:
        answer = finders[source](text)
        if answer:
            return answer
    return None


def extract_gold(gold: str) -> str:
    """A gold answer ready for comparison: the text after the last ``####`` of a GSM8K solution, else the gold."""
    return gold.rsplit("####", 1)[1].strip() if "####" in gold else gold.strip()


def _normalize(text: str) -> str:
    text = text.strip().replace("\\$", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _THOUSANDS.sub("", text)
    if _LATEX_MARKERS.search(text) and not _MATH_DELIMITERS.search(text):
        text = f"${text}$"
    return text


def _equal(prediction: str, gold: str, timeout: int | None) -> bool:
    mv = _math_verify()
    from math_verify.errors import TimeoutException  # a BaseException, so caught here explicitly

    try:
        parsed_gold = mv.parse(_normalize(extract_gold(gold)), parsing_timeout=timeout)
        parsed_prediction = mv.parse(_normalize(prediction), parsing_timeout=timeout)
        if not parsed_gold or not parsed_prediction:
            return False
        return bool(mv.verify(parsed_gold, parsed_prediction, timeout_seconds=timeout))
    except TimeoutException:
        return False


def check_equal(prediction: str, gold: str, timeout: int) -> bool:
    """:func:`math_equal`'s check as it runs in a verifier process: any error gives False."""
    try:
        return _equal(prediction, gold, timeout)
    except Exception:  # noqa: BLE001 - math-verify/sympy may raise anything; a failure scores 0
        return False


_POOL: DeadlinePool | None = None
_POOL_LOCK = threading.Lock()
_GRACE_SECONDS = 1.0


def _verifiers() -> DeadlinePool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = DeadlinePool(f"{__name__}:check_equal", max_workers=min(4, os.cpu_count() or 1))
        return _POOL


def math_equal(prediction: str | None, gold: str | float, timeout_seconds: int = 5) -> bool:
    """Whether ``prediction`` is mathematically equivalent to ``gold`` (a final answer, or a GSM8K ``####``
    solution). Never raises: any error, an unparsable side, or a check exceeding ``timeout_seconds`` gives False.

    The check runs in a verifier process (one of up to four, reused across calls, shared by all rewards of this
    process), so that the timeout holds on any thread and whatever sympy does: math-verify's own timeouts
    (``signal.alarm``) stop most slow checks inside it, and a check still running ``timeout_seconds`` + 1 s after
    the call began is killed with its process (the next call starts a fresh one, about half a second). Measured
    cost of the round trip: ``benchmarks/rewards/bench_math_verify.py``."""
    if prediction is None or not prediction.strip():
        return False
    _math_verify()  # a missing extra is an ImportError here, not a False for every answer
    try:
        return bool(_verifiers().call(prediction, str(gold), timeout_seconds, timeout=timeout_seconds + _GRACE_SECONDS))
    except (DeadlineExceeded, WorkerFailed, RuntimeError):
        return False


class MathAnswerReward(RewardFunction):
    """Outcome reward for math: ``correct_reward`` when the extracted answer is equivalent to any gold answer,
    else ``wrong_reward`` (also when no answer is found). E.g. ReTool (arXiv 2504.11536) uses +1 / -1.

    Args:
        answer_column: Dataset column(s) holding the gold answer (the first present is used); a string, a
            GSM8K ``####`` solution, or a list of acceptable answers.
        sources: Extraction order, see :func:`extract_answer`; ``("answer",)`` is the strict mode.
        correct_reward: Reward for a correct answer.
        wrong_reward: Reward for a wrong or missing answer.
        timeout_seconds: Per-comparison time limit.
        protocol: The tag protocol: its answer tag holds the answer, and its observation tags are removed from the
            text before extraction when there is no trajectory.
        name: The function's ``__name__`` (metric name in TRL).
    """

    def __init__(
        self,
        answer_column: str | Sequence[str] = "answer",
        sources: Sequence[str] = ANSWER_SOURCES,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        timeout_seconds: int = 5,
        protocol: TagProtocol = ANY_TOOL_TAGS,
        name: str = "math_answer",
    ) -> None:
        super().__init__(name)
        self.answer_column = answer_column
        self.sources = tuple(sources)
        extract_answer("", self.sources)  # validate the sources early
        self.protocol = protocol
        self.correct_reward = correct_reward
        self.wrong_reward = wrong_reward
        self.timeout_seconds = timeout_seconds

    def score(self, sample: Sample) -> float:
        answer = extract_answer(sample.model_text(self.protocol.observation_tags), self.sources, self.protocol.answer)
        golds = golds_as_list(sample.column(self.answer_column))
        correct = answer is not None and any(math_equal(answer, gold, self.timeout_seconds) for gold in golds)
        return self.correct_reward if correct else self.wrong_reward
