"""Search-R1: question answering that interleaves reasoning with search-engine calls.

Protocol (Jin et al. 2025, arXiv 2503.09516; PeterGriffinJin/Search-R1): one user turn with Search-R1's instruction,
then the model reasons in ``<think>``, searches with ``<search> query </search>``, reads the top passages in
``\\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n`` and answers with ``<answer> ... </answer>``. An action
with neither a search nor an answer gets Search-R1's corrective message.

Rows have ``question`` and ``golden_answers`` (or Search-R1's parquet ``reward_model.ground_truth.target``, or a
single ``answer``). Reward (``reward``): ``searchr1`` (default), Search-R1 v0.3's exact match with format scores;
``em``: exact match; ``f1``: token F1. Exact match is always computed and logged (``rewards/qa_em/mean``, weight 0
when it is not the training reward); it is the success check of evaluation.

Retrieval: BM25 over a Search-R1 corpus (JSONL of ``{"id", "contents": "\\"Title\\"\\ntext"}``) in this process, a
saved index, or the HTTP API of a retrieval server (``POST /retrieve``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..environments.tag_protocol import SEARCH_R1_TAGS
from ..errors import TaskConfigError
from .base import Task

# Search-R1's instruction (scripts/data_process/qa_search_train_merge.py, make_prefix, template 'base').
SEARCH_R1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

# Search-R1's observation for an action with neither a search nor an answer (search_r1/llm_agent/generation.py).
SEARCH_R1_INVALID_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)


def make_prompt(question: str, chat: bool) -> Any:
    """Search-R1's prompt: the question stripped and ending with '?', in the instruction, as one user message (the
    chat template is applied when the tokenizer has one, as Search-R1 does)."""
    question = question.strip()
    if question and not question.endswith("?"):
        question += "?"
    text = SEARCH_R1_TEMPLATE.format(question=question)
    return [{"role": "user", "content": text}] if chat else text


def golden_answers(row: dict[str, Any]) -> list[str]:
    """The gold answers of a row: ``golden_answers``, else ``reward_model.ground_truth.target`` (Search-R1's parquet
    files), else ``answer``."""
    answers = row.get("golden_answers")
    if answers is None:
        answers = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    if answers is None:
        answers = row.get("answer")
    if answers is None:
        raise TaskConfigError(f"a Search-R1 row has no golden_answers (nor reward_model.ground_truth.target, nor "
                              f"answer); its columns are {sorted(row)}")
    return [answers] if isinstance(answers, str) else [str(a) for a in answers]


@dataclass
class SearchR1Arguments:
    """Options of the Search-R1 task (recipe flags and ``python -m trl_agentic.evaluate`` flags)."""

    corpus: str | None = field(default=None, metadata={
        "help": "Search-R1 corpus (JSONL of {'id', 'contents'}): BM25 in this process."})
    index_dir: str | None = field(default=None, metadata={
        "help": "Saved BM25 index: loaded when it exists, else built from --corpus and saved there."})
    retriever_url: str | None = field(default=None, metadata={
        "help": "Retrieval server instead of local BM25, e.g. http://127.0.0.1:8000/retrieve."})
    topk: int = field(default=3, metadata={"help": "Passages per search (Search-R1: 3)."})
    retrieval_timeout: float = field(default=30.0, metadata={"help": "Seconds per search request."})
    reward: str = field(default="searchr1", metadata={
        "help": "searchr1: EM with Search-R1 v0.3's format scores; em: exact match; f1: token F1.",
        "choices": ["searchr1", "em", "f1"]})


def build_retriever(args: SearchR1Arguments) -> Any:
    """A :class:`~trl_agentic.tools.RetrievalClient` for ``retriever_url`` (whose server must answer now:
    :meth:`~trl_agentic.tools.RetrievalClient.check`), a saved index, or BM25 built from the corpus (and saved to
    ``index_dir`` when given)."""
    from ..tools import BM25Retriever, RetrievalClient, RetrievalServerError, load_retriever

    if args.retriever_url and (args.corpus or args.index_dir):
        raise TaskConfigError("give either --retriever_url or a local corpus (--corpus / --index_dir), not both")
    if args.retriever_url:  # a server that is down would turn every search into an error observation: stop now
        client = RetrievalClient(args.retriever_url, timeout=args.retrieval_timeout)
        try:
            client.check()
        except RetrievalServerError as exc:
            raise TaskConfigError(f"--retriever_url {args.retriever_url}: {exc}") from None
        return client
    if args.index_dir and Path(args.index_dir).exists():
        return load_retriever(args.index_dir)
    if not args.corpus:
        raise TaskConfigError(
            "no retriever: pass --corpus CORPUS.jsonl (BM25 in this process; add --index_dir DIR to keep the index), "
            "--index_dir DIR (a saved index) or --retriever_url http://127.0.0.1:8000/retrieve (a running server)"
        )
    if not Path(args.corpus).exists():
        raise TaskConfigError(f"--corpus {args.corpus} does not exist: pass a Search-R1 corpus JSONL file")
    try:
        retriever = BM25Retriever.from_jsonl(args.corpus)
    except ImportError as exc:
        raise TaskConfigError(f"--corpus needs the retrieval extra ({exc}): pip install 'trl-agentic[retrieval]'")
    if args.index_dir:
        retriever.save(args.index_dir)
    return retriever


def make_task(args: SearchR1Arguments, retriever: Any = None) -> Task:
    """The Search-R1 :class:`Task`; ``retriever`` defaults to :func:`build_retriever` of ``args``."""
    from ..environments.tag_environment import TagEnvironment
    from ..rewards import QAReward, SearchR1Reward
    from ..tools import SearchTool

    if args.reward not in ("searchr1", "em", "f1"):
        raise TaskConfigError(f"--reward {args.reward!r} is unknown: pass searchr1, em or f1")
    retriever = build_retriever(args) if retriever is None else retriever
    search = SearchTool(retriever, topk=args.topk)
    environment = functools.partial(TagEnvironment, tools={"search": (search, "information")},
                                    protocol=SEARCH_R1_TAGS, invalid_message=SEARCH_R1_INVALID_MESSAGE,
                                    tool_timeout=args.retrieval_timeout + 5.0)
    exact_match = QAReward("em")
    if args.reward == "em":
        funcs, weights = [exact_match], [1.0]
    else:  # train on the chosen reward, log exact match with weight 0
        funcs, weights = [SearchR1Reward() if args.reward == "searchr1" else QAReward("f1"), exact_match], [1.0, 0.0]
    return Task(
        name="search_r1",
        protocol=SEARCH_R1_TAGS,
        environment=environment,
        reward_funcs=funcs,
        reward_weights=weights,
        success=exact_match,
        make_prompt=lambda row, chat: make_prompt(row["question"], chat),
        prepare_row=lambda row: {"question": row["question"], "golden_answers": golden_answers(row)},
        required_columns=("question",),
        instructions=SEARCH_R1_TEMPLATE.format(question="{question}"),
        resources=[retriever],
    )
