"""Ready-made agentic tasks shared by the recipes, the notebooks and ``python -m trl_agentic.evaluate``.

=============== ============================================== ==========================================
name            protocol                                       options
=============== ============================================== ==========================================
``gsm8k_tools`` ``<code>`` -> ``<interpreter>`` (or ``<calc>``) :class:`~.gsm8k.GSM8KToolsArguments`
``search_r1``   ``<think>``, ``<search>`` -> ``<information>``  :class:`~.search_r1.SearchR1Arguments`
=============== ============================================== ==========================================

``build_task(name, options, max_completion_length=...)`` gives a :class:`Task`: its ``environment`` and
``reward_funcs`` go to the trainer, ``task.rows(dataset, tokenizer)`` adds the prompts, ``task.success`` scores
evaluation. ``load_rows`` reads a hub dataset or local files with one-line errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ..errors import TaskConfigError
from .base import Task, has_chat_template
from .data import load_rows, require_columns, take
from .gsm8k import GSM8KToolsArguments
from .search_r1 import SearchR1Arguments

TASK_ARGUMENTS: dict[str, type] = {"gsm8k_tools": GSM8KToolsArguments, "search_r1": SearchR1Arguments}


def _builders() -> dict[str, Callable[[Any, int], Task]]:
    from . import gsm8k, search_r1

    return {
        "gsm8k_tools": lambda options, budget: gsm8k.make_task(options, max_completion_length=budget),
        "search_r1": lambda options, budget: search_r1.make_task(options),
    }


def build_task(name: str, options: Any = None, max_completion_length: int = 1024) -> Task:
    """The task ``name`` with ``options`` (an instance of ``TASK_ARGUMENTS[name]`` or of a subclass, such as a
    recipe's ``ScriptArguments``; ``None``: its defaults)."""
    if name not in TASK_ARGUMENTS:
        raise TaskConfigError(f"--task {name!r} is unknown: pass one of {sorted(TASK_ARGUMENTS)}")
    cls = TASK_ARGUMENTS[name]
    # the task's own fields only (a recipe's ScriptArguments subclass the task's arguments)
    options = cls() if options is None else cls(**{f.name: getattr(options, f.name) for f in fields(cls)})
    task = _builders()[name](options, max_completion_length)
    task.options = options
    return task


__all__ = [
    "GSM8KToolsArguments",
    "SearchR1Arguments",
    "TASK_ARGUMENTS",
    "Task",
    "TaskConfigError",
    "build_task",
    "has_chat_template",
    "load_rows",
    "require_columns",
    "take",
]
