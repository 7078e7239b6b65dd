"""A task: what a recipe, a notebook and the evaluation CLI share about one agentic problem.

A :class:`Task` bundles the prompt, the environment factory (one fresh environment per trajectory), the training
reward functions, the success check used for accuracy and pass@k, and the resources to release at the end (a
sandbox's worker pool). ``task.rows(dataset, processing_class)`` turns raw rows into rows with a ``prompt`` column (chat
messages when the tokenizer has a chat template, plain text otherwise) plus the columns the rewards read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..environments.base import EnvironmentFactory
from ..environments.tag_protocol import TagProtocol
from ..rewards.base import RewardFunc


def has_chat_template(processing_class: Any) -> bool:
    """Whether the tokenizer renders chat messages (instruct models) rather than plain text (base models)."""
    return getattr(getattr(processing_class, "tokenizer", processing_class), "chat_template", None) is not None


@dataclass
class Task:
    """One agentic task, ready to train on or to evaluate.

    Attributes:
        name: Registry name (``gsm8k_tools``, ``search_r1``).
        protocol: The tag protocol the environment serves and the rewards read.
        environment: Class or zero-argument factory of the environment.
        reward_funcs: TRL reward functions to train on.
        reward_weights: Their weights (``None``: all 1), for ``AgenticGRPOConfig.reward_weights``.
        success: Reward function whose value 1 means solved: accuracy and pass@k count these.
        make_prompt: ``(row, chat) -> prompt``: chat messages when ``chat``, else text.
        prepare_row: ``row -> extra columns`` (e.g. the gold answers in the form the rewards read).
        required_columns: Columns every raw row must have.
        instructions: The instruction the prompt carries (shown in the model card).
        resources: Objects with ``close()`` to release when training or evaluation ends.
        options: The task's options (its ``*Arguments`` dataclass), to rebuild it with ``build_task``.
    """

    name: str
    protocol: TagProtocol
    environment: EnvironmentFactory
    reward_funcs: list[RewardFunc]
    reward_weights: list[float] | None
    success: RewardFunc
    make_prompt: Callable[[dict[str, Any], bool], Any]
    prepare_row: Callable[[dict[str, Any]], dict[str, Any]]
    required_columns: Sequence[str]
    instructions: str
    resources: list[Any] = field(default_factory=list)
    options: Any = None

    def rows(self, dataset: Any, processing_class: Any, flag: str = "--dataset_name") -> Any:
        """The dataset with a ``prompt`` column and the columns the rewards read (other columns are dropped).

        Built row by row (``Dataset.from_list``), not with ``dataset.map``: ``map`` fingerprints its function by
        pickling it, and this one holds the task (its sandbox, its retriever), which may not pickle: datasets then
        warns that it "couldn't be hashed" on every run."""
        from datasets import Dataset

        from .data import require_columns

        require_columns(dataset, list(self.required_columns), self.name, flag)
        chat = has_chat_template(processing_class)
        return Dataset.from_list([{"prompt": self.make_prompt(row, chat), **self.prepare_row(row)} for row in dataset])

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the task's resources (idempotent); ``with make_task(...) as task:`` calls it at the end."""
        resources, self.resources = self.resources, []
        for resource in resources:
            close = getattr(resource, "close", None)
            if callable(close):
                close()
