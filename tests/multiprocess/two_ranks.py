"""Run under ``accelerate launch --num_processes 2 --cpu``: rank 0's episodes last 1 turn, rank 1's last 3.

Writes ``<out>/rank<k>.json`` with, per step, the generation calls this rank made, its local rewards and
advantages, so the test can check call alignment (no deadlock) and group advantages across ranks; and every
collective call this rank made through ``torch.distributed`` (its name and the innermost function of the library it
was made from), between markers of each generation round and each optimizer step.
"""

import gc
import json
import os
import sys
import time
import traceback

import torch.distributed as dist
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from helpers import EchoEnvironment, agentic_args, lookup_dataset, ppo_args  # noqa: E402

from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer  # noqa: E402
from trl_agentic.rollout import engine as engine_module  # noqa: E402
from trl_agentic.toy import build_tiny_model, build_tokenizer  # noqa: E402

out_dir, model_dir = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "grpo"
dynamic = mode == "dynamic"  # DAPO dynamic sampling with groups spanning ranks
depth = 2 if mode == "async" else 0  # max_staleness: GRPO two rounds behind its background generator
rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))
record = {"generation_calls": [], "rewards": [], "advantages": []}

original_run = engine_module.RolloutEngine.run


def recording_run(self, prompts, rows=None, **kwargs):
    before = self.generation_calls  # the engine is built once per training run: count this round's calls
    trajectories = original_run(self, prompts, rows, **kwargs)
    record["generation_calls"].append(self.generation_calls - before)
    return trajectories


engine_module.RolloutEngine.run = recording_run
record["collectives"] = []


def _counted(name, collective):
    def call(*args, **kwargs):
        frames = traceback.extract_stack()[:-1]
        where = next((f"{os.path.basename(f.filename)}:{f.name}" for f in reversed(frames)
                      if f"{os.sep}trl_agentic{os.sep}" in f.filename), "outside the library")
        record["collectives"].append([name, where])
        return collective(*args, **kwargs)

    return call


for _name in ("all_gather", "all_gather_object", "all_gather_into_tensor", "all_reduce", "broadcast",
              "broadcast_object_list", "barrier", "gather", "gather_object", "scatter", "reduce_scatter_tensor"):
    if hasattr(dist, _name):
        setattr(dist, _name, _counted(_name, getattr(dist, _name)))


class StepMarker(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        record["collectives"].append(["step", ""])

if depth:  # rank 1's job ahead waits during the last step until training ends: it is stopped while it runs (its
    # GenerationStopped once kept the training loop's frames, and the DDP wrapper, alive: gloo's threads outlived the run)
    from trl_agentic.rollout.pipeline import GenerationStopped, StoppableGenerator  # noqa: E402

    record["stopped_while_running"] = 0
    stoppable_generate = StoppableGenerator.generate

    def generate_until_training_ends(self, *args, **kwargs):
        if rank == 1 and trainer.state.global_step >= trainer.args.max_steps - 1:
            if self.stop.wait(timeout=60):  # set when training ends
                time.sleep(0.5)  # still running when the pipeline looks: it waits for the job to end
        try:
            return stoppable_generate(self, *args, **kwargs)
        except GenerationStopped:
            record["stopped_while_running"] += 1
            raise

    StoppableGenerator.generate = generate_until_training_ends


def agent_tokens_reward(completions, trajectory, **kwargs):
    if dynamic:  # many groups with equal rewards
        rewards = [float(t.completion_ids[0] % 2) for t in trajectory]
    else:
        rewards = [float(t.num_agent_tokens % 7) for t in trajectory]
    record["rewards"].append(rewards)
    return rewards


class RecordingTrainer(AgenticPPOTrainer if mode == "ppo" else AgenticGRPOTrainer):
    def generation_round(self, rows, ahead=True):
        record["collectives"].append(["round", ""])
        return super().generation_round(rows, ahead)

    def training_batch(self, rows):
        batch = super().training_batch(rows)
        record["advantages"].append(batch.advantages.tolist())
        return batch


def _native_thread_names() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names


def _gloo_threads_left(within: float = 10.0) -> list[str]:
    """gloo's threads still alive ``within`` seconds after the process group was destroyed (they end on their own
    once the last object holding the group is freed): none may be left to race the interpreter's shutdown."""
    deadline = time.monotonic() + within
    while (left := sorted(name for name in _native_thread_names() if "gloo" in name)) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.2)
    return left


tokenizer = build_tokenizer()
if rank == 0 and not os.path.exists(os.path.join(model_dir, "config.json")):
    build_tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

make_args = ppo_args if mode == "ppo" else agentic_args
args = make_args(
    type("P", (), {"__truediv__": lambda self, other: os.path.join(out_dir, other)})(),
    per_device_train_batch_size=3, num_generations=1 if mode == "ppo" else 2, max_steps=3 if depth else 2,
    max_turns=4, max_completion_length=64, max_tokens_per_turn=6,
    **({"max_staleness": depth, "generator_cpu": 0} if depth else {}),
    **({"zero_variance_groups": "dynamic_sampling", "max_extra_generation_rounds": 8} if dynamic else {}),
)
trainer = RecordingTrainer(model=model_dir, reward_funcs=agent_tokens_reward, args=args,
                           train_dataset=lookup_dataset(12), processing_class=tokenizer,
                           environment=lambda: EchoEnvironment(turns=1 if rank == 0 else 3))
trainer.add_callback(StepMarker())
trainer.train()
if mode == "ppo":
    record["critic_checksum"] = [float(p.detach().double().sum()) for p in trainer.critic.parameters()]
if mode in ("ppo", "async"):
    record["policy_checksum"] = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
if depth:
    pipeline = trainer.rollout_source
    record["staleness"] = [row["async/staleness"] for row in trainer.state.log_history if "loss" in row]
    record["samples"] = [pipeline.started, pipeline.consumed, pipeline.discarded]
    record["generator_cpu"] = pipeline.thread.cpu
# Without it a rank can abort at exit after a good run ("terminate called without an active exception": a gloo
# worker still releasing its last all-reduce needs the GIL during interpreter shutdown).
trainer.end_training()
record["gloo_threads_after_end"] = _gloo_threads_left()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
