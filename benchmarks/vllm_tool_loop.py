"""Ours against TRL 1.16's own tool loop, both on a real vLLM colocate engine (vLLM's CPU backend), one run.

    PYTHONPATH=. .venv-vllm/bin/python benchmarks/vllm_tool_loop.py [--steps 5] [--warmup 1] [--rounds 1]
        [--batch 8] [--num-generations 4] [--iterations 2] [--json FILE]

Both sides are TRL's ``GRPOTrainer(tools=[add])`` on the same ``GRPOConfig`` (``use_vllm=True,
vllm_mode="colocate"``, seed 0), the same tiny model and dataset (``tests/tool_calling_model.py``: a random
Qwen2.5-convention model, every turn constrained by vLLM's structured outputs to a call of ``add`` or of the
unknown ``sub``, so both loops really parse and run calls, and rollouts end at the turn limit): ``trl`` is TRL's class, whose ``_tool_call_loop`` runs the calls; ``ours``
is :class:`~trl_agentic.AgenticGRPOTrainer`, which takes ``tools=`` into our engine. A round trains one trainer per
side (the order alternates between rounds); the first ``--warmup`` steps of each are dropped.

Reported per side, median over the kept steps of every round: rollout wall time per step (TRL's ``_generate``, or
our trainer's ``rollout``: vLLM generation, tool calls, weight sync; timed by a subclass, benchmark only), whole step time
(``on_step_begin`` to ``on_step_end``), and per step: agent tokens generated (tokens with ``tool_mask`` 1), assistant
turns, tool calls (``<tool_call>`` tokens the model generated), and rollout time per generated token. The two loops
sample different sequences (they call vLLM differently), so compare the per-token time and the counts, not only
the step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _name, _value in {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                      "VLLM_CPU_KVCACHE_SPACE": "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29651", "TRL_EXPERIMENTAL_SILENCE": "1"}.items():
    os.environ.setdefault(_name, _value)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def cpu_weight_sync() -> None:
    """TRL's colocate weight sync on vLLM's CPU backend needs Linear layers that keep their weight (see
    ``tests/vllm_engine/conftest.py`` and ``../shared/notes/vllm-cpu.md``); a no-op on CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    from vllm.model_executor.layers import utils

    def plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    utils.dispatch_cpu_unquantized_gemm = plain_linear


def timed(base: type) -> type:
    """``base`` with its rollout timed and its output counted: TRL's ``_generate`` (TRL's side) or our
    ``rollout`` (ours: our round does not go through ``_generate``)."""

    class Timed(base):
        rollouts: list[dict[str, float]]

        def _generate(self, prompts):
            started = time.perf_counter()
            out = super()._generate(prompts)
            seconds = time.perf_counter() - started
            _, completion_ids, tool_mask, *_ = out
            tok = self.processing_class
            header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
            call = tok.convert_tokens_to_ids("<tool_call>")
            masks = tool_mask if tool_mask is not None else [[1] * len(ids) for ids in completion_ids]
            tokens = sum(sum(mask) for mask in masks)
            calls = sum(t == call and m for ids, mask in zip(completion_ids, masks) for t, m in zip(ids, mask))
            turns = sum(1 + sum(ids[i:i + len(header)] == header for i in range(len(ids)))
                        for ids in completion_ids)
            self.rollouts.append(dict(rollout_s=seconds, tokens=tokens, turns=turns, calls=calls,
                                      rows=len(completion_ids)))
            return out

        def rollout(self, rows, ahead=True):  # ours: AgenticGRPOTrainer's rollout (weight sync, vLLM, tool calls)
            started = time.perf_counter()
            rollouts = super().rollout(rows, ahead)
            trajectories = rollouts.runs
            seconds = time.perf_counter() - started
            call = self.processing_class.convert_tokens_to_ids("<tool_call>")
            self.rollouts.append(dict(
                rollout_s=seconds, tokens=sum(sum(t.env_mask) for t in trajectories),
                turns=sum(t.num_turns for t in trajectories), rows=len(trajectories),
                calls=sum(i == call and m for t in trajectories for i, m in zip(t.completion_ids, t.env_mask))))
            return rollouts

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


def run_side(side: str, model_dir: str, args: argparse.Namespace, output_dir: str) -> list[dict[str, float]]:
    from tool_calling_model import TURN_REGEX, add, tool_dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic import AgenticGRPOTrainer

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.started, self.seconds = 0.0, []

        def on_step_begin(self, *a, **k):
            self.started = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.seconds.append(time.perf_counter() - self.started)
            print(f"  {side}: step {len(self.seconds)} {self.seconds[-1]:.2f} s", flush=True)

    config = GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=args.batch, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, max_tool_calling_iterations=args.iterations,
        max_steps=args.warmup + args.steps, learning_rate=1e-3, report_to="none", use_cpu=True, bf16=False,
        seed=0, save_strategy="no", logging_steps=1, use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3, vllm_max_model_length=1024, vllm_structured_outputs_regex=TURN_REGEX)

    def reward(completions, answer, **kwargs):
        return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]

    timer = StepTimer()
    trainer_class = timed(GRPOTrainer if side == "trl" else AgenticGRPOTrainer)
    trainer = trainer_class(model=model_dir, processing_class=AutoTokenizer.from_pretrained(model_dir), args=config,
                            train_dataset=tool_dataset(64), reward_funcs=reward, tools=[add], callbacks=[timer])
    trainer.rollouts = []
    trainer.train()
    steps = [dict(r, step_s=s) for r, s in zip(trainer.rollouts, timer.seconds)]
    del trainer
    return steps[args.warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="measured steps per trainer")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped at the start of each trainer")
    parser.add_argument("--rounds", type=int, default=1, help="trainers per side (order alternates)")
    parser.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size (rollouts per step)")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=2, help="max_tool_calling_iterations")
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--json", help="write the per-step records here")
    args = parser.parse_args()

    from tool_calling_model import build_tool_calling_model

    cpu_weight_sync()
    root = tempfile.mkdtemp(prefix="vllm-tool-loop-")
    model_dir = build_tool_calling_model(Path(root) / "model")
    print(f"load average at start: {os.getloadavg()}", flush=True)
    records: dict[str, list[dict[str, float]]] = {"trl": [], "ours": []}
    for r in range(args.rounds):
        for side in (("trl", "ours") if r % 2 == 0 else ("ours", "trl")):
            print(f"round {r + 1}: {side}", flush=True)
            records[side] += run_side(side, model_dir, args, str(Path(root) / f"{side}-{r}"))
    print(f"load average at end: {os.getloadavg()}")

    def median(side: str, key: str) -> float:
        return statistics.median(step[key] for step in records[side])

    rows = []
    for side in ("trl", "ours"):
        per_token = statistics.median(s["rollout_s"] / max(s["tokens"], 1) for s in records[side])
        rows.append((side, median(side, "rollout_s"), median(side, "step_s"), median(side, "tokens"),
                     median(side, "turns") / median(side, "rows"), median(side, "calls"), per_token * 1e3))
    print("\n| side | rollout s/step | step s | agent tokens/step | turns/rollout | tool calls/step | rollout ms/token |")
    print("|---|---|---|---|---|---|---|")
    for side, *values in rows:
        print(f"| {side} | " + " | ".join(f"{v:.3g}" for v in values) + " |")
    trl, ours = rows
    print(f"\nours / trl: rollout {ours[1] / trl[1]:.2f}, step {ours[2] / trl[2]:.2f}, "
          f"rollout per token {ours[6] / trl[6]:.2f} (medians over {len(records['trl'])} steps per side)")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
