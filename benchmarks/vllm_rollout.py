"""vLLM against transformers ``generate`` in our rollout engine, side by side in one process (vLLM's CPU backend).

    PYTHONPATH=. .venv-vllm/bin/python benchmarks/vllm_rollout.py [--turns 1 2 4 8] [--batch 8] [--repeats 3]
        [--tokens-per-turn 16] [--observation-tokens 48] [--prompt-tokens 400] [--hidden 256] [--layers 4] [--json FILE]
        [--engines vllm vllm-nocache vllm-bf16]

One random Qwen2 (head_dim 64), saved once, and four generators over it: ``hf`` (:class:`HFGenerator`, float32),
``vllm`` (:class:`VLLMGenerator`, float32, prefix caching on: TRL's colocate default), ``vllm-nocache`` (the same,
``enable_prefix_caching=False``) and ``vllm-bf16`` (bfloat16, what vLLM's CPU backend picks for a float32 checkpoint
when no dtype is given, as in TRL's colocate mode). All are greedy, so the token streams are the same on the float32
sides (checked: ``same_streams``); a turn is ``--tokens-per-turn`` tokens unless the model samples its end id, and
every observation is the same text. The engines run in process (TRL's colocate setting)
and eager (``enforce_eager``: no compilation at start-up). Sides are interleaved within each repeat. ``--engines``
names the vLLM sides to run beside ``hf`` (none: ``hf`` alone, which needs no vLLM).

Reported per turn count: median rollout wall time per side and its ratio to ``hf``; prefilled tokens per trajectory
(the tokens whose keys and values were computed: for ``hf`` its ``prefilled_tokens``, the prompt ids each turn's
``generate`` computed, only what the turn appended while it keeps the KV cache across turns; for vLLM the prompt
tokens minus ``num_cached_tokens``); and on the trajectories' agent tokens the log-prob gap
(mean and max |delta|) of ``vllm`` and ``vllm-bf16`` against the float32 model's forward pass over the same
trajectories (the trainer's log-probs), and of ``vllm-bf16`` against the bfloat16 model's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

for _name, _value in {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                      "VLLM_CPU_KVCACHE_SPACE": "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29641"}.items():
    os.environ.setdefault(_name, _value)

ENGINES = {"vllm": {"dtype": "float32", "enable_prefix_caching": True},
           "vllm-nocache": {"dtype": "float32", "enable_prefix_caching": False},
           "vllm-bf16": {"dtype": "bfloat16", "enable_prefix_caching": True}}
"""The vLLM sides: the ``vllm.LLM`` arguments of each (besides the shared ones)."""


class FixedObservation:
    """Ends after ``row["turns"]`` steps; every observation is the same text."""

    def __init__(self, text: str) -> None:
        self.text, self.n, self.turns = text, 0, 1

    def reset(self, **row):
        self.n, self.turns = 0, row["turns"]

    def step(self, action):
        from trl_agentic.environments.base import StepResult

        self.n += 1
        return StepResult(observation=self.text, reward=0.0, terminated=self.n >= self.turns)


class CountingLLM:
    """A ``vllm.LLM`` that sums the prompt tokens it was sent and the ones it found in its prefix cache."""

    def __init__(self, llm) -> None:
        self.llm, self.prompt_tokens, self.cached_tokens = llm, 0, 0

    def generate(self, prompts, params, use_tqdm=False):
        outputs = self.llm.generate(prompts, params, use_tqdm=use_tqdm)
        for out in outputs:
            self.prompt_tokens += len(out.prompt_token_ids)
            self.cached_tokens += out.num_cached_tokens or 0
        return outputs


def agent_logps(model, trajectories):
    """The model's log-prob of each agent token of each trajectory (a forward pass over prompt + completion)."""
    import torch

    rows = []
    for t in trajectories:
        ids = torch.tensor([t.prompt_ids + t.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1].float()
        rows.append(torch.log_softmax(logits, -1).gather(-1, ids[0, len(t.prompt_ids):, None]).squeeze(-1))
    return rows


def gap(trajectories, reference):
    import torch

    from trl_agentic.rollout.metrics import logprob_gap

    sampled = torch.cat([torch.tensor(t.logprobs) for t in trajectories])
    mask = torch.cat([torch.tensor(t.env_mask) for t in trajectories])
    return logprob_gap(torch.cat(reference), sampled, mask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens-per-turn", type=int, default=16)
    parser.add_argument("--observation-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", default=None)
    parser.add_argument("--engines", nargs="*", choices=list(ENGINES), default=list(ENGINES),
                        help="the vLLM sides beside hf (none: hf alone, without vLLM)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from trl_agentic import run_rollouts
    from trl_agentic.rollout.generation import HFGenerator
    from trl_agentic.rollout.vllm import VLLMGenerator
    from trl_agentic.toy import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    path = tempfile.mkdtemp(prefix="vllm-bench-")
    build_tiny_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers).save_pretrained(path)
    tokenizer.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = model.generation_config
    config.do_sample = False

    engines = {}
    if args.engines:
        from vllm import LLM

        engines = {name: CountingLLM(LLM(model=path, distributed_executor_backend="external_launcher",
                                         enforce_eager=True, max_model_len=2048, seed=0, max_num_batched_tokens=4096,
                                         **ENGINES[name]))
                   for name in ENGINES if name in args.engines}
        block = next(iter(engines.values())).llm.llm_engine.vllm_config.cache_config.block_size
        print(f"vLLM KV-cache block size {block} tokens (prefix caching reuses whole blocks)", flush=True)
    model_bf16 = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval() if "vllm-bf16" in engines
                  else None)
    generators = {"hf": HFGenerator(model, tokenizer, config, return_logprobs=True),
                  **{name: VLLMGenerator(llm, greedy=True) for name, llm in engines.items()}}
    words = "key value of the tool result number please".split()
    prompt_text = " ".join(words[i % len(words)] for i in range(args.prompt_tokens))
    observation = " ".join(words[(3 * i) % len(words)] for i in range(args.observation_tokens))

    results = []
    for turns in args.turns:
        rows = [{"prompt": f"{i} {prompt_text}\n", "turns": turns} for i in range(args.batch)]
        times = {name: [] for name in generators}
        prefilled, outputs = {}, {}
        for repeat in range(args.repeats + 1):  # repeat 0 warms up (the first vLLM calls are slow) and is dropped
            for name, generator in generators.items():
                llm = engines.get(name)
                if llm is not None:
                    llm.llm.reset_prefix_cache()  # each rollout starts cold: only the turns of this rollout share it
                    llm.prompt_tokens = llm.cached_tokens = 0
                else:
                    generator.prefilled_tokens = 0
                start = time.perf_counter()
                outputs[name] = run_rollouts(None, tokenizer, lambda: FixedObservation(observation), rows,
                                             generator=generator, max_turns=turns,
                                             max_tokens_per_turn=args.tokens_per_turn, max_completion_length=1900,
                                             max_observation_tokens=args.observation_tokens, overlap_chunks=1)
                if repeat:
                    times[name].append(time.perf_counter() - start)
                computed = generator.prefilled_tokens if llm is None else llm.prompt_tokens - llm.cached_tokens
                prefilled[name] = computed / args.batch
        hf = outputs["hf"]
        same = {name: [t.completion_ids for t in outputs[name]] == [t.completion_ids for t in hf]
                for name in engines}
        medians = {name: statistics.median(values) for name, values in times.items()}
        result = {
            "turns": turns,
            "median_s": medians,
            "ratio_to_hf": {name: medians[name] / medians["hf"] for name in medians},
            "prefilled_tokens_per_trajectory": prefilled,
            "agent_tokens_per_trajectory": sum(t.num_agent_tokens for t in hf) / args.batch,
            "same_streams": same,
            "logprob_gap_vs_fp32_model": {name: gap(outputs[name], agent_logps(model, outputs[name]))
                                          for name in ("vllm", "vllm-bf16") if name in engines},
        }
        if model_bf16 is not None:
            result["logprob_gap_bf16_vs_bf16_model"] = gap(outputs["vllm-bf16"],
                                                           agent_logps(model_bf16, outputs["vllm-bf16"]))
        results.append(result)
        print(json.dumps(result), flush=True)
    gapped = [name for name in ("vllm", "vllm-bf16") if name in engines]
    headers = ["turns", "hf s", *(f"{name} / hf" for name in engines), "prefilled/traj hf", *engines,
               *(f"gap {name} mean/max" for name in gapped)]
    print("\n| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in results:
        g, p = r["logprob_gap_vs_fp32_model"], r["prefilled_tokens_per_trajectory"]
        cells = [str(r["turns"]), f"{r['median_s']['hf']:.3f}", *(f"{r['ratio_to_hf'][name]:.2f}" for name in engines),
                 *(f"{p[name]:.0f}" for name in ("hf", *engines)),
                 *(f"{g[name][0]:.1e} / {g[name][1]:.1e}" for name in gapped)]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
