"""A model card that says how to run the trained agent: its tool protocol, its prompt, a ``run_rollouts`` snippet.

TRL's card says "fine-tuned version of [None]" when the base model is a local directory, and nothing about the
tool protocol, without which the model cannot be used. :func:`model_card` writes one that states the base model
(a hub link, or the local path), the task, the tags and what each tool returns, the stop strings, the rollout
budgets, the instruction the prompts carry, and the code to roll the model out with the same engine it was trained
with. A trainer given ``task=`` writes it wherever TRL writes its card (checkpoints, ``push_to_hub``).
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

PAPERS = {
    "search_r1": ("Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement Learning",
                  "2503.09516"),
    "gsm8k_tools": ("ReTool: Reinforcement Learning for Strategic Tool Use in LLMs", "2504.11536"),
}


def _base_model(trainer: Any) -> str | None:
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base.config, "_name_or_path", None) or None


def _options_code(task: Any) -> str:
    options = task.options
    if options is None:
        return ""
    defaults = type(options)()
    changed = [f"{f.name}={getattr(options, f.name)!r}" for f in fields(options)
               if getattr(options, f.name) != getattr(defaults, f.name)]
    return f"{type(options).__name__}({', '.join(changed)})"


def _protocol_lines(task: Any, args: Any) -> list[str]:
    p = task.protocol
    lines = [f"- `<{tool}>...</{tool}>` calls a tool; its output comes back as `<{obs}>...</{obs}>` (masked out of "
             "the loss during training)." for tool, obs in p.tools.items()]
    if p.think:
        lines.insert(0, f"- `<{p.think}>...</{p.think}>` holds the reasoning before each action.")
    lines.append(f"- `<{p.answer}>...</{p.answer}>` gives the final answer and ends the episode.")
    lines.append(f"- Generation stops after {', '.join(f'`{s}`' for s in p.stop_strings)}; the environment then "
                 "appends the observation and generation resumes.")
    lines.append(f"- Rollouts: `rollout_mode={args.rollout_mode!r}`, at most {args.max_turns} model turns, "
                 f"{args.max_tokens_per_turn} tokens per turn, {args.max_completion_length} completion tokens in all, "
                 f"observations cut to {args.max_observation_tokens} tokens.")
    return lines


def model_card(trainer: Any, task: Any, model_name: str | None = None, dataset_name: str | None = None,
               tags: list[str] | None = None) -> Any:
    """A ``huggingface_hub.ModelCard`` for an agent trained by ``trainer`` on ``task`` (module docstring)."""
    from huggingface_hub import ModelCard, ModelCardData

    args = trainer.args
    base = _base_model(trainer)
    on_hub = bool(base) and not os.path.isdir(base)
    title = args.hub_model_id or model_name or os.path.basename(os.path.abspath(args.output_dir))
    repo = args.hub_model_id or args.output_dir  # where from_pretrained finds it
    algo = "ppo" if "PPO" in type(trainer).__name__ else "grpo"
    paper = PAPERS.get(task.name)
    data = ModelCardData(base_model=base if on_hub else None, datasets=dataset_name, library_name="transformers",
                         tags=sorted({"trl", "trl-agentic", algo, "agentic", "tool-use", task.name, *(tags or [])}))
    origin = f"[{base}](https://huggingface.co/{base})" if on_hub else (f"the local model `{base}`" if base else
                                                                        "a model built in memory")
    data_part = f" on `{dataset_name}`" if dataset_name else ""
    options = _options_code(task)
    task_import = type(task.options).__name__ if task.options is not None else None
    snippet = "\n".join([
        "from datasets import Dataset",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "from trl_agentic import run_rollouts",
        "from trl_agentic.tasks import " + ", ".join(["build_task"] + ([task_import] if task_import else [])),
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{repo}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo}")',
        f'task = build_task("{task.name}"{", " + options if options else ""})',
        'rows = task.rows(Dataset.from_list([{"question": "...", '
        + ('"answer": "#### ..."' if task.name == "gsm8k_tools" else '"golden_answers": ["..."]') + "}]), tokenizer)",
        "trajectories = run_rollouts(model, tokenizer, task.environment, rows, "
        f"rollout_mode={args.rollout_mode!r}, max_turns={args.max_turns},",
        f"                            max_tokens_per_turn={args.max_tokens_per_turn}, "
        f"max_completion_length={args.max_completion_length}, max_observation_tokens={args.max_observation_tokens})",
        'print("".join(a + (o or "") for a, o in zip(trajectories[0].actions, trajectories[0].observations)))',
        "task.close()",
    ])
    hyper = {name: getattr(args, name) for name in ("learning_rate", "beta", "num_generations", "max_steps",
                                                    "per_device_train_batch_size", "temperature", "kl_estimator")}
    text = "\n".join([
        "---", data.to_yaml(), "---", "",
        f"# {title}", "",
        f"An agent fine-tuned from {origin}{data_part} with trl-agentic's `{type(trainer).__name__}` (on top of "
        f"[TRL](https://github.com/huggingface/trl)) for the `{task.name}` task: it acts over several turns, calls "
        "tools through text tags, reads their output and answers.", "",
        "## Tool protocol", "", *_protocol_lines(task, args), "",
        "## Prompt", "",
        "Every prompt carries this instruction (as the system message for `gsm8k_tools`, inside the user message "
        "for `search_r1`; plain text when the tokenizer has no chat template):", "",
        "```text", task.instructions, "```", "",
        "## Use it", "",
        "Roll it out with the engine it was trained with (`pip install trl-agentic`): the task rebuilds the "
        "environment and the tools, `run_rollouts` runs the turns.", "",
        "```python", snippet, "```", "",
        "Measure it (accuracy, pass@k, turns, tool calls):", "",
        "```bash",
        f"python -m trl_agentic.evaluate --model {repo} --task {task.name} --dataset DATA --samples 4 --k 1 4",
        "```", "",
        "## Training", "",
        f"{algo.upper()} with `{type(args).__name__}`: "
        + ", ".join(f"`{k}={v}`" for k, v in hyper.items()) + ". Tool output tokens are masked out of the loss.",
        *(["", f"Method: [{paper[0]}](https://huggingface.co/papers/{paper[1]})."] if paper else []),
        "",
    ])
    return ModelCard(text)
