"""GSM8K with a tool: grade-school math solved by running Python (ReTool's protocol) or a calculator.

The model reasons in free text, runs code in ``<code>...</code>`` and reads the output in
``<interpreter>...</interpreter>`` (ReTool, arXiv 2504.11536: one persistent, sandboxed Python session per
trajectory), or with ``tool="calculator"`` writes ``<calc>expression</calc>`` and reads ``<result>...</result>``, or
with ``tool="calculator_native"`` calls ``calculate(expression)`` in its chat template's own tool-call format.
It ends with ``<answer>N</answer>``. Rows are GSM8K's ``{"question", "answer"}``; the gold number follows ``####``.

Reward (:class:`~trl_agentic.rewards.CompositeReward`, each term logged as ``reward/<name>``)::

    1.0 * correct     MathAnswerReward: the <answer> is equivalent to the number after '####' (math-verify)
  + format_weight * format      ProtocolFormatReward: the tag protocol, on the model's text, in [0, 1]
  + tool_weight * tool_use      ToolUseReward (ToolRL): +0.5 when the tool was called, -0.25 per invalid call
  + length_weight * length      optional: DAPO's overlong penalty over the last quarter of the budget
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from ..environments.tag_protocol import TagProtocol
from ..errors import TaskConfigError
from .base import Task

PYTHON_SYSTEM_PROMPT = """\
You are a careful math assistant who can run Python code.

Solve the problem step by step. When you need to calculate something, write Python code between <code> and </code>, \
for example:
<code>
apples = 3 * 12
print(apples - 5)
</code>
The code runs in a Python interpreter and what it prints comes back to you between <interpreter> and </interpreter>. \
Variables you define stay available in later <code> blocks. Print every value you want to see. Never write \
<interpreter> yourself: stop after </code> and wait for the output.

When you know the final answer, write only the number between <answer> and </answer>, for example <answer>31</answer>, \
and stop."""

CALCULATOR_SYSTEM_PROMPT = """\
You are a careful math assistant who can use a calculator.

Solve the problem step by step. When you need to calculate something, write one arithmetic expression between <calc> \
and </calc>, for example <calc>3 * 12 - 5</calc>. The calculator knows + - * / // % ** and parentheses, and functions \
such as sqrt, round, min, max and floor. Its result comes back to you between <result> and </result>. Never write \
<result> yourself: stop after </calc> and wait for the result.

When you know the final answer, write only the number between <answer> and </answer>, for example <answer>31</answer>, \
and stop."""

NATIVE_CALCULATOR_SYSTEM_PROMPT = """\
You are a careful math assistant who can use a calculator.

Solve the problem step by step. When you need to calculate something, call the calculate tool with one arithmetic \
expression; its result comes back to you as the tool's answer.

When you know the final answer, write only the number between <answer> and </answer>, for example <answer>31</answer>, \
and stop."""


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: One expression with + - * / // % ** and parentheses, and functions such as sqrt, round, min, max
            and floor, e.g. "3 * 12 - 5".
    """
    from ..tools.calculator import format_number, safe_eval

    return format_number(safe_eval(expression))


PROTOCOLS: dict[str, TagProtocol] = {
    "python": TagProtocol(think=None, tools={"code": "interpreter"}, answer="answer"),
    "calculator": TagProtocol(think=None, tools={"calc": "result"}, answer="answer"),
    "calculator_native": TagProtocol(think=None, tools={}, answer="answer"),  # the answer tag only; calls are native
}
SYSTEM_PROMPTS = {"python": PYTHON_SYSTEM_PROMPT, "calculator": CALCULATOR_SYSTEM_PROMPT,
                  "calculator_native": NATIVE_CALCULATOR_SYSTEM_PROMPT}


def invalid_message(tool: str) -> str:
    """The corrective observation after an action with neither a tool call nor an answer."""
    tag = next(iter(PROTOCOLS[tool].tools))
    what = "run code, I should put the code" if tool == "python" else "calculate, I should put the expression"
    return (
        f"\nMy previous action is invalid. To {what} between <{tag}> and </{tag}>. To give the final answer, I "
        "should put the number between <answer> and </answer>. Let me try again.\n"
    )


def make_prompt(question: str, system_prompt: str, chat: bool) -> Any:
    """System + user messages for tokenizers with a chat template, else plain text for base models."""
    question = question.strip()
    if chat:
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
    return f"{system_prompt}\n\nQuestion: {question}\n\n"


@dataclass
class GSM8KToolsArguments:
    """Options of the GSM8K-with-tools task (recipe flags and ``python -m trl_agentic.evaluate`` flags)."""

    tool: str = field(default="python", metadata={
        "help": "python: sandboxed interpreter with <code>/<interpreter> (ReTool); calculator: <calc>/<result>; "
                "calculator_native: a calculate(expression) tool called in the chat template's own tool-call format "
                "(instruct models with tool calling; rollout_mode='chat').",
        "choices": ["python", "calculator", "calculator_native"]})
    answer_sources: list[str] = field(default_factory=lambda: ["answer"], metadata={
        "help": "Where the final answer is read, in order: 'answer' (the <answer> block), 'boxed' (last \\boxed{}), "
                "'number' (last number). Default: the <answer> block only (strict)."})
    format_weight: float = field(default=0.2, metadata={"help": "Weight of the format reward."})
    tool_weight: float = field(default=0.1, metadata={"help": "Weight of the tool-use shaping."})
    length_weight: float = field(default=0.0, metadata={
        "help": "Weight of DAPO's overlong penalty over the last quarter of max_completion_length (0: off)."})
    sandbox_timeout: float = field(default=10.0, metadata={"help": "Seconds per <code> block."})
    sandbox_memory_mb: int = field(default=1024, metadata={"help": "Memory limit of each interpreter (MiB)."})
    sandbox_pool_size: int = field(default=4, metadata={"help": "Interpreters started ahead of time."})


def make_task(args: GSM8KToolsArguments, max_completion_length: int = 1024) -> Task:
    """The GSM8K-with-tools :class:`Task` (environment, rewards, prompt) for ``args``."""
    from ..rewards import MathAnswerReward

    if args.tool not in PROTOCOLS:
        raise TaskConfigError(f"--tool {args.tool!r} is unknown: pass one of {sorted(PROTOCOLS)}")
    protocol = PROTOCOLS[args.tool]
    try:
        correct = MathAnswerReward(answer_column="answer", sources=tuple(args.answer_sources), name="correct")
    except ValueError as exc:
        raise TaskConfigError(f"--answer_sources {args.answer_sources}: {exc}") from None
    if args.tool == "calculator_native":
        from ..environments.native_tools import ToolCallEnvironment

        # the chat template shows calculate's schema and writes the calls; the reward is the answer's correctness
        # (tool errors are counted in the rollout metrics, agentic/tool_error_per_trajectory)
        environment: Any = functools.partial(ToolCallEnvironment, [calculate], tool_timeout=args.sandbox_timeout)
        reward_funcs, resources = [correct], []
    else:
        environment, reward_funcs, resources = _tag_tool(args, protocol, correct, max_completion_length)
    system_prompt = SYSTEM_PROMPTS[args.tool]
    return Task(
        name="gsm8k_tools",
        protocol=protocol,
        environment=environment,
        reward_funcs=reward_funcs,
        reward_weights=None,
        success=correct,
        make_prompt=lambda row, chat: make_prompt(row["question"], system_prompt, chat),
        prepare_row=lambda row: {"question": row["question"], "answer": row["answer"]},
        required_columns=("question", "answer"),
        instructions=system_prompt,
        resources=resources,
    )


def _tag_tool(args: GSM8KToolsArguments, protocol: TagProtocol, correct: Any,
              max_completion_length: int) -> tuple[Any, list[Any], list[Any]]:
    """The tag forms: the environment serving ``<code>`` or ``<calc>``, the composite reward, the tool to close."""
    from ..environments.tag_environment import TagEnvironment
    from ..rewards import Component, CompositeReward, LengthPenalty, ProtocolFormatReward, ToolUseReward

    tag = next(iter(protocol.tools))
    if args.tool == "python":
        from ..tools import PythonSandbox

        # One interpreter session per trajectory (TagEnvironment calls sandbox.session()), in a separate,
        # resource-limited process; bubblewrap isolation where available.
        tool: Any = PythonSandbox(timeout=args.sandbox_timeout, memory_mb=args.sandbox_memory_mb,
                                  pool_size=args.sandbox_pool_size)
    else:
        from ..tools import Calculator

        tool = Calculator()
    environment = functools.partial(TagEnvironment, tools={tag: (tool, protocol.tools[tag])}, protocol=protocol,
                                    invalid_message=invalid_message(args.tool), tool_timeout=args.sandbox_timeout + 5.0)
    components = [
        Component("correct", correct, weight=1.0, outcome=True),
        Component("format", ProtocolFormatReward(protocol), weight=args.format_weight, clip=(0.0, 1.0)),
        Component("tool_use", ToolUseReward(required_tools={tag}, known_tools={tag}, protocol=protocol),
                  weight=args.tool_weight, clip=(-0.5, 0.5)),
    ]
    if args.length_weight:
        budget = max_completion_length
        components.append(Component(
            "length", LengthPenalty.overlong(max_length=budget, cache_length=max(1, budget // 4)),
            weight=args.length_weight, clip=(-1.0, 0.0)))
    return environment, [CompositeReward(components, name="gsm8k_reward")], [tool]
