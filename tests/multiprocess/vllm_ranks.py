"""Run under ``accelerate launch --multi_gpu --num_processes 2`` (CPU, gloo): AgenticGRPOTrainer with TRL's real
``VLLMGeneration``, in server mode (``VLLMClient`` stubbed) and in colocate mode with tensor parallelism 2
(``vllm.LLM`` stubbed), two steps each, with unequal numbers of active trajectories per turn on the two processes.

``server_async``: server mode with asynchronous rollouts (``max_staleness=1``): each process sends its own prompts
from its background thread through a client of its own, the main process pushes the weights between rounds.

Usage: ``vllm_ranks.py OUT_DIR MODEL_DIR MODE...`` (MODE: ``server``, ``colocate_tp`` or ``server_async``). Writes
``OUT_DIR/rank<k>_<mode>.json`` after every round (so a run that dies later still shows what came back): per round,
the number of prompts this process sent per generation call, the requests the stub served, and every trajectory's
prompt, completion, turn spans and per-turn sampled ids (``tests/multiprocess/vllm_stubs.py`` ``encode``).
"""

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
sys.path.insert(0, os.path.dirname(__file__))

from helpers import EchoEnvironment, agentic_args, lookup_dataset  # noqa: E402
from vllm_stubs import install  # noqa: E402

from trl_agentic import AgenticGRPOTrainer  # noqa: E402
from trl_agentic.rollout import engine as engine_module  # noqa: E402
from trl_agentic.rollout import vllm as vllm_module  # noqa: E402
from trl_agentic.toy import build_tokenizer  # noqa: E402

out_dir, model_dir, modes = sys.argv[1], sys.argv[2], sys.argv[3:]
rank = int(os.environ["RANK"])
# turns of this process's 3 trajectories, per round. Round 0: process 1 never has more active trajectories than
# process 0 (3/3, 2/3, 1/2 per turn); round 1 the other way round.
SCHEDULE = {0: ([2, 3, 3], [1, 2, 3]), 1: ([1, 2, 3], [2, 3, 3])}[rank]

state = {"round": 0, "turns": iter(())}
record: dict = {}


def environment():
    return EchoEnvironment(turns=next(state["turns"]))


original_run = engine_module.RolloutEngine.run


def recording_run(self, prompts, rows=None, **kwargs):
    state["turns"] = itertools.cycle(SCHEDULE[state["round"] % 2])
    record["rounds"].append({"sent": [], "served": [], "turns": SCHEDULE[state["round"] % 2]})
    served_before = len(record["served"])
    trajectories = original_run(self, prompts, rows, **kwargs)
    current = record["rounds"][-1]
    current["served"] = record["served"][served_before:]
    current["trajectories"] = [{"prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids,
                                "turn_spans": t.turn_spans, "generated_ids": t.generated_ids} for t in trajectories]
    state["round"] += 1
    with open(os.path.join(out_dir, f"rank{rank}_{record['mode']}.json"), "w") as f:
        json.dump({k: v for k, v in record.items() if k != "served"}, f)
    return trajectories


original_generate = vllm_module.TRLVLLMGenerator.generate


def recording_generate(self, prompts, *args, **kwargs):
    record["rounds"][-1]["sent"].append(len(prompts))
    return original_generate(self, prompts, *args, **kwargs)


engine_module.RolloutEngine.run = recording_run
vllm_module.TRLVLLMGenerator.generate = recording_generate


def reward(completions, **kwargs):
    return [float(len(str(c)) % 5) for c in completions]


trainer = None
for mode in modes:
    record.clear()
    record.update(mode=mode, rounds=[], served=[])
    state["round"] = 0
    install("colocate" if mode == "colocate_tp" else "server", record["served"])
    vllm = {"server": {"vllm_mode": "server"}, "server_async": {"vllm_mode": "server", "max_staleness": 1},
            "colocate_tp": {"vllm_mode": "colocate", "vllm_tensor_parallel_size": 2}}[mode]
    args = agentic_args(
        type("P", (), {"__truediv__": lambda self, other, mode=mode: os.path.join(out_dir, mode, other)})(),
        per_device_train_batch_size=3, num_generations=2, max_steps=2, max_turns=4, max_completion_length=64,
        max_tokens_per_turn=6, use_vllm=True, **vllm)
    trainer = AgenticGRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=lookup_dataset(12),
                                 processing_class=build_tokenizer(), environment=environment)
    trainer.train()
    with open(os.path.join(out_dir, f"rank{rank}_{mode}_end.json"), "w") as f:
        json.dump({"served": record["served"], "staleness": [row.get("async/staleness")
                                                              for row in trainer.state.log_history if "loss" in row]}, f)
trainer.end_training()
