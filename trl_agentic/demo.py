"""Offline CPU demo: a tiny model learns to use a lookup tool, with the library's whole pipeline.

    python -m trl_agentic.demo                  # native tool calls through a TRL environment_factory class
    python -m trl_agentic.demo --task tags      # the same task with text tags and a trl-agentic Environment
    python -m trl_agentic.demo --quick          # a shorter look

The task: ``find key k37`` -> the agent calls the lookup tool with ``k37``, reads the value and answers with it. The
value is drawn at random for every row, independently of the key, so no model can know it without the tool; success
is the outcome (the right value, after a lookup), measured greedily on held-out prompts. Two ways to give it:

- ``--task native`` (the default): TRL's pattern, :class:`~trl_agentic.toy.native.KeyValueStore` as
  ``environment_factory=``; the model writes a JSON tool call in Qwen2.5-Instruct's chat template
  (``<tool_call>{"name": "lookup", "arguments": {"key": "k37"}}</tool_call>``), TRL's response template parses it, the
  class's method answers in a ``tool`` message, and the reward function reads the conversation. Its tokenizer is
  trained on the task's conversations (:func:`~trl_agentic.toy.native.build_tool_tokenizer`), so that a random
  2-layer model can learn the call's format in minutes, as a real instruct model knows it already.
- ``--task tags``: text tags, ``<lookup>k37</lookup>`` -> ``<result>7</result>``, ``<answer>7</answer>``, with
  :class:`~trl_agentic.toy.LookupEnvironment` as ``environment=``.

The pipeline is the one a user runs, through the public entry points, each given the same rollout argument: a
tokenizer and a 2-layer Qwen2 built on the spot (nothing is downloaded), an agentic SFT warm start on a handful of
demonstrations (:func:`trl_agentic.sft.sft_dataset` replays them through the rollout engine against the real tool,
observations masked, then TRL's ``SFTTrainer``), then ``AgenticGRPOTrainer`` with the outcome reward, with
:func:`trl_agentic.evaluate.evaluate` on held-out prompts before, after SFT and after GRPO. It writes to the output
directory a reward curve (``reward_curve.png``), a successful and a failed trajectory where there are both
(``trajectories.html``), every held-out trajectory (``heldout_trajectories.jsonl``), the tokenizer (``tokenizer/``,
for ``python -m trl_agentic.render ... --tokenizer``) and ``summary.json``. The same seed gives the same numbers on
the same machine (one thread, deterministic algorithms).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

PROMPT_SEEDS = {"demonstrations": 1, "train": 3, "heldout": 7}  # disjoint draws of keys and values


@dataclass(frozen=True)
class DemoTask:
    """One way to give the lookup task (module docstring): what the entry points receive, the rows and their
    demonstrations, the outcome reward, the budgets and the warm start it needs.

    Attributes:
        title: What the first line says the model learns.
        rollout: The rollout argument every entry point receives (``environment=`` or ``environment_factory=``).
        tokenizer: Builds the tokenizer, on the spot.
        rows: ``rows(n, seed)``: ``n`` dataset rows drawn with ``seed``.
        demonstration: A row with its ``completion``, as ``sft_dataset`` takes it.
        success: The outcome reward, a TRL reward function (1 or 0).
        budgets: ``max_turns``, ``max_tokens_per_turn``, ``max_completion_length``.
        sft_epochs: Epochs of the warm start over the demonstrations.
        sft_options: More keyword arguments of ``sft_dataset`` (the tag protocol).
        steps: GRPO steps unless ``--steps`` says otherwise.
    """

    title: str
    rollout: dict[str, Any]
    tokenizer: Callable[[], Any]
    rows: Callable[[int, int], list[dict[str, Any]]]
    demonstration: Callable[[dict[str, Any]], dict[str, Any]]
    success: Callable[..., list[float]]
    budgets: dict[str, int]
    sft_epochs: int
    sft_options: dict[str, Any]
    steps: int


def demo_task(name: str) -> DemoTask:
    """``native``: TRL's ``environment_factory`` class and native tool calls; ``tags``: text tags and a trl-agentic
    environment."""
    from trl_agentic.toy import (
        LOOKUP_TAGS,
        LookupEnvironment,
        build_tokenizer,
        lookup_success,
        make_lookup_dataset,
    )
    from trl_agentic.toy.native import (
        KeyValueStore,
        build_tool_tokenizer,
        key_value_demonstration,
        key_value_success,
    )

    if name == "native":
        return DemoTask(
            title="native tool calls through a TRL environment_factory class", tokenizer=build_tool_tokenizer,
            rollout={"environment_factory": KeyValueStore},
            rows=lambda n, seed: make_lookup_dataset(n, seed=seed, conversational=True),
            demonstration=key_value_demonstration, success=key_value_success,
            budgets=dict(max_turns=3, max_tokens_per_turn=16, max_completion_length=48), sft_epochs=80,
            sft_options={}, steps=80)
    return DemoTask(
        title="a lookup tool with text tags (environment=)", tokenizer=build_tokenizer,
        rollout={"environment": LookupEnvironment}, rows=lambda n, seed: make_lookup_dataset(n, seed=seed),
        demonstration=lambda row: {**row, "completion": f"<lookup>{row['key']}</lookup><answer>{row['value']}"
                                                        "</answer>"},
        success=lookup_success, budgets=dict(max_turns=3, max_tokens_per_turn=12, max_completion_length=48),
        sft_epochs=40, sft_options={"protocol": LOOKUP_TAGS}, steps=120)


@dataclass
class DemoSettings:
    """The knobs of the demo (``--quick`` shrinks the run, not the method)."""

    hidden_size: int = 64
    demonstrations: int = 32
    sft_learning_rate: float = 3e-3
    steps: int | None = None  # the task's
    learning_rate: float = 1e-3
    prompts_per_step: int = 8
    num_generations: int = 8
    heldout: int = 100
    log_every: int = 10
    seed: int = 0


def _parse(argv: list[str] | None) -> tuple[DemoSettings, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m trl_agentic.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = DemoSettings()
    parser.add_argument("--task", default="native", choices=("native", "tags"),
                        help="native: TRL's environment_factory and native tool calls (default); tags: text tags")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: 80 native, 120 tags)")
    parser.add_argument("--quick", action="store_true", help="40 GRPO steps and 50 held-out prompts")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--output-dir", default=None, help="where the plot, page and summary go (default: a temp dir)")
    parser.add_argument("--max-staleness", type=int, default=0,
                        help="D >= 1: GRPO D rounds behind its generator (asynchronous rollouts; default 0)")
    parser.add_argument("--async-correction", default="decoupled", choices=("decoupled", "behaviour", "none"),
                        help="with --max-staleness >= 1: the off-policy correction (default decoupled)")
    parser.add_argument("--async-generator", default="thread", choices=("thread", "process"),
                        help="with --max-staleness >= 1: generate on a background thread (default) or in a child "
                        "process")
    args = parser.parse_args(argv)
    settings = DemoSettings(seed=args.seed)
    if args.quick:
        settings.steps, settings.heldout = 40, 50
    if args.steps is not None:
        settings.steps = args.steps
    return settings, args


def _remove_if_empty(path: str) -> None:
    """Drop a trainer's ``output_dir`` when the run saved nothing in it (the demo keeps no checkpoint)."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _quiet(trainer: Any) -> Any:
    """Drop the Trainer's printing of raw log dictionaries (the demo prints its own compact lines)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def main(argv: list[str] | None = None) -> dict[str, Any]:
    settings, args = _parse(argv)
    start = time.perf_counter()
    import datasets
    import torch
    from datasets import Dataset
    from transformers import GenerationConfig, TrainerCallback
    from transformers import logging as hf_logging
    from trl import SFTConfig, SFTTrainer

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer
    from trl_agentic.evaluate import evaluate
    from trl_agentic.sft import sft_dataset
    from trl_agentic.toy import build_tiny_model

    hf_logging.set_verbosity_error()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # the same numbers whatever the machine's core count
    torch.use_deterministic_algorithms(True)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="trl-agentic-demo-")
    os.makedirs(output_dir, exist_ok=True)

    task = demo_task(args.task)
    settings.steps = settings.steps or task.steps
    tokenizer = task.tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=settings.hidden_size, seed=settings.seed)
    heldout = task.rows(settings.heldout, PROMPT_SEEDS["heldout"] + 1000 * settings.seed)
    greedy = GenerationConfig(do_sample=False, max_new_tokens=task.budgets["max_tokens_per_turn"],
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)

    def measure(label: str) -> Any:
        report, trajectories = evaluate(model, tokenizer, rows=heldout, reward_funcs=task.success, greedy=True,
                                        generation_config=greedy, show_progress=False, overlap_chunks=1,
                                        **task.budgets, **task.rollout)
        print(f"{label:<22} success {report.accuracy:6.1%}   turns {report.mean_turns:.2f}   "
              f"tool calls {report.mean_tool_calls:.2f}   ({time.perf_counter() - start:.0f} s)", flush=True)
        return report, trajectories

    print(f"trl-agentic demo: a 2-layer Qwen2 learns {task.title}; {settings.heldout} held-out prompts, "
          f"seed {settings.seed}, output in {output_dir}", flush=True)
    before, _ = measure("untrained")

    # 1. Agentic SFT warm start: demonstrations replayed through the engine against the real tool
    demos = [task.demonstration(row) for row in task.rows(settings.demonstrations, PROMPT_SEEDS["demonstrations"])]
    dataset = sft_dataset(demos, tokenizer, show_progress=False, overlap_chunks=1, **task.sft_options,
                          **task.budgets, **task.rollout)
    sft_args = SFTConfig(output_dir=os.path.join(output_dir, "sft"), num_train_epochs=task.sft_epochs,
                         per_device_train_batch_size=16, learning_rate=settings.sft_learning_rate,
                         lr_scheduler_type="constant", logging_steps=10, report_to="none", use_cpu=True, bf16=False,
                         save_strategy="no", seed=settings.seed, disable_tqdm=True)
    sft = _quiet(SFTTrainer(model=model, args=sft_args, train_dataset=dataset, processing_class=tokenizer))
    sft_loss = sft.train().training_loss
    _remove_if_empty(sft_args.output_dir)
    print(f"SFT warm start: {len(dataset)} demonstrations x {task.sft_epochs} epochs, mean loss {sft_loss:.3f}",
          flush=True)
    after_sft, _ = measure("after SFT")

    # 2. GRPO with the same rollout argument and the outcome reward
    curve: list[tuple[int, float]] = []

    class CompactLog(TrainerCallback):
        def on_log(self, _args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            curve.append((state.global_step, logs["reward"]))
            if state.global_step % settings.log_every == 0 or state.global_step == settings.steps:
                print(f"  GRPO step {state.global_step:3d}   reward {logs['reward']:.3f}   "
                      f"turns {logs.get('agentic/turns_mean', 0):.2f}   "
                      f"lookup calls {logs.get('agentic/tool_calls/lookup_per_trajectory', 0):.2f}", flush=True)

    grpo_args = AgenticGRPOConfig(
        output_dir=os.path.join(output_dir, "grpo"), per_device_train_batch_size=settings.prompts_per_step *
        settings.num_generations, num_generations=settings.num_generations, max_steps=settings.steps,
        learning_rate=settings.learning_rate, lr_scheduler_type="constant", beta=0.0, temperature=1.0,
        logging_steps=1, report_to="none", use_cpu=True, bf16=False, seed=settings.seed, save_strategy="no",
        disable_tqdm=True, **task.budgets, overlap_chunks="1", max_staleness=args.max_staleness,
        async_correction=args.async_correction, async_generator=args.async_generator,
    )
    train = Dataset.from_list(task.rows(512, PROMPT_SEEDS["train"]))
    grpo = _quiet(AgenticGRPOTrainer(model=model, reward_funcs=task.success, args=grpo_args, train_dataset=train,
                                     processing_class=tokenizer, callbacks=[CompactLog()], **task.rollout))
    grpo.train()
    _remove_if_empty(grpo_args.output_dir)
    after, trajectories = measure(f"after GRPO ({settings.steps} st.)")

    seconds = time.perf_counter() - start
    summary = {
        "task": args.task, "success_before": before.accuracy, "success_after_sft": after_sft.accuracy,
        "success_after": after.accuracy, "heldout_prompts": settings.heldout, "demonstrations": len(dataset),
        "steps": settings.steps, "seed": settings.seed, "seconds": round(seconds, 1),
        "max_staleness": args.max_staleness,
        "async_correction": args.async_correction if args.max_staleness else None,
        "async_generator": args.async_generator if args.max_staleness else None,
    }
    paths = _write_outputs(output_dir, summary, curve, trajectories, after.rewards, tokenizer)
    print(f"\n{'stage':<26}{'success':>8}\n{'untrained':<26}{before.accuracy:>8.1%}\n"
          f"{'after SFT warm start':<26}{after_sft.accuracy:>8.1%}\n{'after SFT + GRPO':<26}{after.accuracy:>8.1%}")
    print(f"\n{settings.heldout} held-out prompts, {seconds:.0f} s. Written: " + ", ".join(paths))
    return summary


def showcase(trajectories: list[Any], rewards: list[float]) -> tuple[list[dict[str, Any]], str]:
    """The first success and the first failure (those that exist) as rows for ``render_html``, and a page title
    that says which are shown."""
    success = next((t for t, r in zip(trajectories, rewards) if r == 1.0), None)
    failure = next((t for t, r in zip(trajectories, rewards) if r != 1.0), None)
    shown = [{**t.to_dict(), "reward": r, "success": r == 1.0} for t, r in zip(trajectories, rewards)
             if t is success or t is failure]
    if success is not None and failure is not None:
        what = "a success and a failure"
    elif success is not None:
        what = "a success (every held-out prompt succeeded)"
    else:
        what = "a failure (no held-out prompt succeeded)"
    return shown, f"trl-agentic demo: {what} after training"


def _write_outputs(output_dir, summary, curve, trajectories, rewards, tokenizer) -> list[str]:
    from trl_agentic.render import render_html
    from trl_agentic.trajectory import save_trajectories

    paths = []
    path = os.path.join(output_dir, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    paths.append(path)
    path = os.path.join(output_dir, "heldout_trajectories.jsonl")
    if os.path.exists(path):
        os.remove(path)  # save_trajectories appends
    save_trajectories(trajectories, path, extra={"reward": list(rewards)})
    paths.append(path)
    shown, title = showcase(trajectories, rewards)
    path = os.path.join(output_dir, "trajectories.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(shown, tokenizer, title=title))
    paths.append(path)
    path = os.path.join(output_dir, "tokenizer")  # python -m trl_agentic.render ... --tokenizer <this>
    tokenizer.save_pretrained(path)
    paths.append(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no reward curve; pip install matplotlib)")
        return paths
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s for s, _ in curve], [r for _, r in curve], color="#3b6ea8", linewidth=1)
    ax.set(xlabel="GRPO step", ylabel="mean reward (sampled, T=1)", ylim=(0, 1.05),
           title=f"success {summary['success_before']:.0%} -> {summary['success_after_sft']:.0%} (SFT) -> "
                 f"{summary['success_after']:.0%} (GRPO), held-out, greedy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(output_dir, "reward_curve.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)
    return paths


if __name__ == "__main__":
    main()
