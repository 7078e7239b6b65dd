"""GSM8K with a tool: RL (GRPO, or PPO) that teaches a small model to compute with Python or a calculator.

The model reasons in free text, runs code in ``<code>...</code>`` and reads the interpreter's output in
``<interpreter>...</interpreter>`` (ReTool's protocol, arXiv 2504.11536; a persistent, sandboxed Python session per
trajectory), or with ``--tool calculator`` writes ``<calc>expression</calc>`` and reads ``<result>...</result>``. It
ends with ``<answer>N</answer>``. Interpreter/calculator tokens are masked out of the loss.

Reward (``CompositeReward``, each component logged as ``reward/<name>``)::

    1.0 * correct     MathAnswerReward: the <answer> is equivalent to the number after '####' (math-verify)
  + 0.2 * format      tag protocol followed (reasoning -> tool -> observation -> ... -> answer), capped to [0, 1]
  + 0.1 * tool_use    ToolRL-style shaping: +0.5 when the tool was called, -0.25 per invalid call, in [-0.5, 0.5]
  + 0.1 * length      optional (--length-penalty): DAPO overlong penalty on the model's own tokens

Run from a checkout with the package installed (``pip install -e ".[math,retrieval]"``). Commands (single GPU; the
defaults download Qwen/Qwen2.5-0.5B-Instruct and openai/gsm8k "main" from the hub)::

    python recipes/gsm8k_tools.py --use-lora
    python recipes/gsm8k_tools.py --model Qwen/Qwen2.5-1.5B-Instruct --use-lora
    python recipes/gsm8k_tools.py --tool calculator --use-lora --max-steps 200
    python recipes/gsm8k_tools.py --load-in-4bit                              # QLoRA (CUDA + bitsandbytes)
    python recipes/gsm8k_tools.py --use-lora --use-vllm --vllm-mode colocate  # vLLM generation (CUDA + vllm)
    python recipes/gsm8k_tools.py --algo ppo --use-lora                       # PPO with a critic

Local model and data (no hub access; a folder with train.jsonl/test.jsonl of GSM8K rows, or one JSONL file)::

    python recipes/gsm8k_tools.py --model /models/Qwen2.5-0.5B-Instruct --dataset-path data/gsm8k --use-lora
    python recipes/gsm8k_tools.py --model ./my-model --dataset-path data/gsm8k/train.jsonl --use-cpu \\
        --precision fp32 --max-steps 2 --num-generations 2 --per-device-train-batch-size 4

Several GPUs (see docs/recipes.md)::

    accelerate launch --config_file recipes/accelerate/multi_gpu.yaml recipes/gsm8k_tools.py --use-lora
    accelerate launch --config_file recipes/accelerate/deepspeed_zero3.yaml recipes/gsm8k_tools.py \\
        --model Qwen/Qwen2.5-1.5B-Instruct

``python recipes/gsm8k_tools.py --help`` lists every option. Save rollouts with ``--trajectory-dir DIR`` and look at
them with ``python -m trl_agentic.render DIR/trajectories-rank0.jsonl``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported from the tests
from _common import (  # noqa: E402
    RecipeError,
    add_common_args,
    build_config,
    check_requirements,
    close_at_end,
    finalize_args,
    has_chat_template,
    load_rows,
    load_tokenizer,
    model_settings,
    precision_settings,
    require_columns,
    run_main,
    set_offline_friendly_env,
    take,
    trainer_classes,
)

DEFAULTS: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "output_dir": "outputs/gsm8k-tools",
    "max_steps": 500,
    "lr_full": 1e-6,
    "lr_lora": 2e-5,
    "num_generations": 8,
    "beta": 0.0,  # ReTool trains without KL
    "rollout_mode": "text",
    "max_turns": 4,
    "max_tokens_per_turn": 384,
    "max_completion_length": 1024,
    "max_observation_tokens": 256,
}

HUB_DATASET, HUB_CONFIG = "openai/gsm8k", "main"

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

# tool option -> (tool tag, observation tag, system prompt)
TOOLS: dict[str, tuple[str, str, str]] = {
    "python": ("code", "interpreter", PYTHON_SYSTEM_PROMPT),
    "calculator": ("calc", "result", CALCULATOR_SYSTEM_PROMPT),
}


def invalid_message(tool: str) -> str:
    """The corrective observation after an action with neither a tool call nor an answer."""
    tag = TOOLS[tool][0]
    what = "run code, I should put the code" if tool == "python" else "calculate, I should put the expression"
    return (
        f"\nMy previous action is invalid. To {what} between <{tag}> and </{tag}>. To give the final answer, I "
        "should put the number between <answer> and </answer>. Let me try again.\n"
    )


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python recipes/gsm8k_tools.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = parser.add_argument_group("task")
    g.add_argument("--tool", choices=sorted(TOOLS), default="python",
                   help="python: sandboxed interpreter with <code>/<interpreter> (ReTool); calculator: <calc>/<result>")
    g.add_argument("--answer-sources", default="answer",
                   help="where the final answer may be read, in order, comma-separated, from 'answer' (the <answer> "
                        "block), 'boxed' (last \\boxed{}), 'number' (last number) (default: %(default)s, strict)")
    g.add_argument("--format-weight", type=float, default=0.2, help="weight of the format reward (default: %(default)s)")
    g.add_argument("--tool-weight", type=float, default=0.1, help="weight of the tool-use shaping (default: %(default)s)")
    g.add_argument("--length-penalty", action="store_true",
                   help="add DAPO's overlong penalty over the last quarter of --max-completion-length")
    g.add_argument("--length-weight", type=float, default=0.1)
    g.add_argument("--sandbox-timeout", type=float, default=10.0, help="seconds per <code> block (default: %(default)s)")
    g.add_argument("--sandbox-memory-mb", type=int, default=1024)
    g.add_argument("--sandbox-pool-size", type=int, default=4, help="interpreters started ahead of time")
    add_common_args(parser, defaults=DEFAULTS)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = make_parser().parse_args(argv)
    return finalize_args(args, DEFAULTS)


# --------------------------------------------------------------------------------------------------------------
# Data, environment, reward
# --------------------------------------------------------------------------------------------------------------


def make_prompt(question: str, system_prompt: str, chat: bool) -> Any:
    """Chat messages for tokenizers with a chat template, else plain text for base models."""
    question = question.strip()
    if chat:
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
    return f"{system_prompt}\n\nQuestion: {question}\n\n"


def build_dataset(args: argparse.Namespace, tokenizer: Any) -> Any:
    """GSM8K rows as ``{"prompt", "question", "answer"}``; ``answer`` keeps the solution (gold after ``####``)."""
    dataset = load_rows(args.dataset_path, HUB_DATASET, HUB_CONFIG, args.dataset_split)
    require_columns(dataset, ["question", "answer"], "GSM8K")
    dataset = take(dataset, args.max_train_samples)
    system_prompt, chat = TOOLS[args.tool][2], has_chat_template(tokenizer)
    extra = [c for c in dataset.column_names if c not in ("question", "answer")]
    return dataset.map(
        lambda row: {"prompt": make_prompt(row["question"], system_prompt, chat)}, remove_columns=extra
    )


def build_environment(args: argparse.Namespace) -> tuple[Any, Any]:
    """The environment factory (one ``TagEnvironment`` per trajectory) and the resource to close at the end."""
    from trl_agentic import TagEnvironment

    tag, observation_tag, _ = TOOLS[args.tool]
    if args.tool == "python":
        from trl_agentic.tools import PythonSandbox

        # One interpreter session per trajectory (TagEnvironment calls sandbox.session()), in a separate,
        # resource-limited process; bubblewrap isolation where available.
        tool = PythonSandbox(
            timeout=args.sandbox_timeout, memory_mb=args.sandbox_memory_mb, pool_size=args.sandbox_pool_size
        )
    else:
        from trl_agentic.tools import Calculator

        tool = Calculator()
    factory = functools.partial(
        TagEnvironment,
        tools={tag: (tool, observation_tag)},
        invalid_message=invalid_message(args.tool),
        tool_timeout=args.sandbox_timeout + 5.0,
    )
    return factory, tool


def _observation_blocks(observation: str, tags: Sequence[str]) -> str:
    """The ``<tag>...</tag>`` block of an observation, without the chat-template text around it in chat mode; a block
    whose end was cut by the token budget is closed again."""
    for tag in tags:
        start = observation.find(f"<{tag}>")
        if start >= 0:
            end = observation.find(f"</{tag}>", start)
            return observation[start : end + len(tag) + 3] if end >= 0 else observation[start:] + f"</{tag}>"
    return ""


def protocol_format_reward(spec: Any) -> Any:
    """``FormatReward`` over the model's actions and the bare observation blocks.

    In chat mode an observation carries chat-template tokens (end of the assistant turn, tool role header) that would
    count as stray text and penalize every tool call; corrective messages after an invalid action are not part of
    the protocol either. Both are left out, so the score measures what the model wrote.
    """
    from trl_agentic.rewards import FormatReward, check_format

    class ProtocolFormatReward(FormatReward):
        def score(self, sample: Any) -> float:
            t = sample.trajectory
            if t is None:
                return super().score(sample)
            parts = []
            for k, action in enumerate(t.actions):
                parts.append(action)
                observation = t.observations[k] if k < len(t.observations) else None
                if observation:
                    parts.append(_observation_blocks(observation, self.protocol.observation_tags))
            return check_format("".join(parts), self.protocol).score

    return ProtocolFormatReward(spec, name="format")


def build_reward(args: argparse.Namespace) -> Any:
    from trl_agentic.rewards import (
        Component,
        CompositeReward,
        LengthPenalty,
        MathAnswerReward,
        TagProtocol,
        ToolUseReward,
    )

    tag, observation_tag, _ = TOOLS[args.tool]
    sources = tuple(s.strip() for s in args.answer_sources.split(",") if s.strip())
    try:
        correct = MathAnswerReward(answer_column="answer", sources=sources)
    except ValueError as exc:
        raise RecipeError(f"--answer-sources {args.answer_sources!r}: {exc}") from None
    spec = TagProtocol(think=None, tools={tag: observation_tag}, answer="answer")
    components = [
        Component("correct", correct, weight=1.0, outcome=True),
        Component("format", protocol_format_reward(spec), weight=args.format_weight, clip=(0.0, 1.0)),
        Component(
            "tool_use",
            ToolUseReward(required_tools={tag}, known_tools={tag}, protocol=spec),
            weight=args.tool_weight,
            clip=(-0.5, 0.5),
        ),
    ]
    if args.length_penalty:
        budget = args.max_completion_length
        components.append(
            Component("length", LengthPenalty.overlong(max_length=budget, cache_length=max(1, budget // 4)),
                      weight=args.length_weight, clip=(-1.0, 0.0))
        )
    return CompositeReward(components, name="gsm8k_reward")


# --------------------------------------------------------------------------------------------------------------
# Trainer
# --------------------------------------------------------------------------------------------------------------


def build_trainer(args: argparse.Namespace) -> Any:
    """Everything but training: checks, tokenizer, data, environment, reward, config, trainer."""
    set_offline_friendly_env()
    check_requirements(args)  # QLoRA / vLLM requirements, before anything is loaded
    precision = precision_settings(args)
    model = model_settings(args, precision)
    tokenizer = load_tokenizer(args.model)
    dataset = build_dataset(args, tokenizer)
    reward = build_reward(args)
    config = build_config(args, precision, model)
    environment, tool = build_environment(args)
    trainer_cls, _ = trainer_classes(args.algo)
    return trainer_cls(
        model=args.model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment=environment,
        peft_config=model["peft_config"],
        quantization_config=model["quantization_config"],
        callbacks=[close_at_end(tool)],
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build_trainer, parse_args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
