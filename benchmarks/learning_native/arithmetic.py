"""Arithmetic word problems with a calculator, through TRL's own interface: a task a 135M instruct model cannot
solve without the tool, whose every rollout takes two model turns (issue 51's candidate sized to a CPU).

A problem multiplies a three-digit and a four-digit number, then (in most templates) adds or takes away a third
number, all written in a short story: ``"A warehouse stores 347 crates of 1286 bottles each. 215 bottles are
broken. How many bottles are left?"`` (gold ``446027``). No model of this size multiplies such numbers in its head
(zero-shot EM is measured), so a right answer needs the tool: one ``calculate`` call with the right expression,
then the number alone as the reply. What the model must get right is which numbers to combine and how (the story
says it; some templates carry a number that is not part of the answer) and copying digits exactly.

Two generators, each a list of templates: :data:`TEMPLATES` (training, SFT and the held-out test) and
:data:`TRANSFER_TEMPLATES` (other stories, other wording, other distractors; never trained on) for the second score.
Rows are drawn deterministically from a seed (:func:`make_rows`): ``{"question", "golden_answers": [str],
"expression"}``; test and transfer rows use seeds of their own, so no training question is held out.

The interface (``--task arithmetic`` of ``run.py``):

- ``environment_factory=CalculatorEnvironment``: one tool method, ``calculate(expression)`` (the library's safe
  calculator, :func:`trl_agentic.tools.calculator.safe_eval`), and no ``get_reward``: TRL's environments see tool
  calls only, and the answer is the reply, so the reward is a reward function on the completion,
  :func:`final_number_em`: 1 when the last number of the rollout's last assistant message (a turn without a tool
  call; thousands separators allowed) equals the gold, else 0;
- ``tools=[calculate]``: the same tool standalone, the same reward;
- ``agent=``: the same as an OpenAI SDK agent (:func:`calculator_agent`), returning its reply.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

INSTRUCTION = "Use the calculate tool for the arithmetic, then reply with the number alone."
"""The user message's first line."""

TEMPLATES: tuple[tuple[str, str], ...] = (
    ("A warehouse stores {a} crates with {b} bottles in each crate. How many bottles does it store?", "{a} * {b}"),
    ("A farm has {a} rows of trees with {b} trees in each row. How many trees are there?", "{a} * {b}"),
    ("A printer prints {b} pages an hour for {a} hours, then {c} more pages. How many pages does it print?",
     "{a} * {b} + {c}"),
    ("A library has {a} shelves of {b} books each. It lends out {c} books. How many books are left?",
     "{a} * {b} - {c}"),
    ("A factory packs {a} boxes of {b} screws and {c} loose screws. How many screws are there in total?",
     "{a} * {b} + {c}"),
    ("A stadium has {a} sections of {b} seats. {c} seats are broken. How many seats can be used?", "{a} * {b} - {c}"),
    ("A school has {d} classes. Each of its {a} buses carries {b} pupils a year. How many pupils do the buses carry?",
     "{a} * {b}"),
    ("A baker sells {a} loaves a day for {b} days and gives away {c} loaves. How many loaves are sold?",
     "{a} * {b} - {c}"),
)
"""The training generator: (story, expression) templates. ``a`` has three digits, ``b`` four, ``c`` three or four,
``d`` two (a distractor: it is in the story, not in the answer)."""

TRANSFER_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("What is the area in square metres of a field {a} metres wide and {b} metres long?", "{a} * {b}"),
    ("Tickets cost {a} cents each and {b} were sold. A refund of {c} cents was paid. How many cents were taken?",
     "{a} * {b} - {c}"),
    ("A ship makes {d} voyages. Its hold takes {a} barrels of {b} litres, plus a {c} litre tank. How many litres "
     "does one full load carry?", "{a} * {b} + {c}"),
    ("A mine digs {b} tonnes a week for {a} weeks and then {c} tonnes in the last week. How many tonnes in all?",
     "{a} * {b} + {c}"),
)
"""The second generator (never trained on): other stories and wording, the same arithmetic."""

GENERATORS = {"train": TEMPLATES, "transfer": TRANSFER_TEMPLATES}


def make_rows(n: int, seed: int, generator: str = "train") -> list[dict[str, Any]]:
    """``n`` problems of ``generator`` (``"train"`` or ``"transfer"``), drawn from ``seed``: the templates in turn,
    the numbers at random (module docstring)."""
    rng = random.Random(seed)
    templates = GENERATORS[generator]
    rows = []
    for k in range(n):
        story, expression = templates[k % len(templates)]
        numbers = {"a": rng.randint(101, 999), "b": rng.randint(1001, 9999), "c": rng.randint(101, 4999),
                   "d": rng.randint(11, 99)}
        worked = expression.format(**numbers)
        rows.append({"question": story.format(**numbers), "golden_answers": [str(_evaluate(worked))],
                     "expression": worked})
    return rows


def task_rows(train: int, test: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The task's question sets: ``train`` training and ``test`` held-out problems of the training generator, and
    ``test`` of the transfer generator, each from its own seed (derived from ``seed``)."""
    return {"train": make_rows(train, 1000 * seed + 1), "test": make_rows(test, 1000 * seed + 2),
            "transfer": make_rows(test, 1000 * seed + 3, "transfer")}


def _evaluate(expression: str) -> int | float | str:
    from trl_agentic.tools.calculator import safe_eval

    value = safe_eval(expression)
    return int(value) if isinstance(value, float) and value.is_integer() else value


class CalculatorEnvironment:
    """A TRL environment (``environment_factory=CalculatorEnvironment``) with one tool, ``calculate`` (module
    docstring). ``reset`` keeps nothing: the reward reads the reply."""

    def reset(self, **row: Any) -> None:
        return None

    def calculate(self, expression: str) -> str:
        """
        Evaluate an arithmetic expression.

        Args:
            expression: The expression: numbers, the operators + - * / and parentheses.

        Returns:
            The value of the expression.
        """
        try:
            return str(_evaluate(expression))
        except Exception as exc:  # noqa: BLE001 - the model reads the error
            return f"Error: {exc}"


def calculate(expression: str) -> str:
    """
    Evaluate an arithmetic expression.

    Args:
        expression: The expression: numbers, the operators + - * / and parentheses.

    Returns:
        The value of the expression.
    """
    return CalculatorEnvironment().calculate(expression)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str | None) -> str | None:
    """The last number written in ``text`` (thousands separators dropped, a trailing ``.0`` kept as written), or
    ``None``."""
    if not isinstance(text, str):
        return None
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def number_match(reply: str | None, golds: Sequence[str]) -> float:
    """1.0 when the last number of ``reply`` equals a gold answer as a number, else 0.0 (non-text scores 0)."""
    value = last_number(reply)
    if value is None:
        return 0.0
    try:
        return float(any(float(value) == float(g) for g in golds))
    except ValueError:
        return 0.0


def final_number_em(completions: Sequence[Any], golden_answers: Sequence[Any], trajectory: Sequence[Any] | None = None,
                    **kwargs: Any) -> list[float]:
    """TRL reward function: :func:`number_match` of the rollout's reply (its last assistant message when that calls
    no tool)."""
    from benchmarks.learning_native.task import final_message, rollout_messages

    return [number_match(final_message(m), g) for m, g in zip(rollout_messages(completions, trajectory), golden_answers)]


def agent_number_em(completions: Sequence[Any], golden_answers: Sequence[Any], agent_output: Sequence[Any],
                    **kwargs: Any) -> list[float]:
    """The agent interface's reward: :func:`number_match` of the reply the agent returned."""
    return [number_match(reply, g) for reply, g in zip(agent_output, golden_answers)]


def tool_schemas(interface: str) -> list[Callable[..., Any]]:
    """The tools the model is shown: the environment's ``calculate`` method, or the standalone function."""
    from trl_agentic.environments.native_tools import tool_methods

    return [calculate] if interface == "tools" else tool_methods(CalculatorEnvironment())


def calculator_agent(max_turns: int) -> Callable[..., Any]:
    """The task as an agent of the OpenAI SDK (``task.tool_loop_agent``): the ``calculate`` tool, and the agent
    returns its reply (``None`` when the turns ran out inside a call)."""
    from benchmarks.learning_native.task import tool_loop_agent

    return tool_loop_agent(CalculatorEnvironment, max_turns, lambda environment, reply: reply)


def demonstration(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The worked messages of ``row``: one ``calculate`` call with its expression, the tool's result, the number."""
    result = CalculatorEnvironment().calculate(row["expression"])
    return [{"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "calculate",
                                                              "arguments": {"expression": row["expression"]}}}]},
            {"role": "tool", "name": "calculate", "content": result},
            {"role": "assistant", "content": result}]
