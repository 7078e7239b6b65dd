"""Peak memory (RSS, CPU) of each PPO critic option on a small model.

    python benchmarks/critic_memory.py [--hidden 512] [--layers 8] [--options shared-head shared-adapter]

Each option runs in its own process: build the policy (a random Qwen2 of the given size), build the critic, then
one forward + backward of policy log-probs and clipped value loss on a batch, and report the peak RSS from
``resource.getrusage``. Options: ``policy-only`` (baseline, no critic), ``separate`` (full copy of the policy as
value model), ``separate-lora`` (copy with frozen base + LoRA), ``shared-head`` (value head over the policy's
decoder), ``shared-adapter`` (LoRA policy + a critic LoRA adapter on the same base weights), compared with
``policy-only-lora`` (the LoRA policy alone). ``--options`` measures some of them (each with its baseline).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

OPTIONS = ("policy-only", "separate", "separate-lora", "shared-head", "policy-only-lora", "shared-adapter")
BASELINE = {"shared-adapter": "policy-only-lora"}  # compare a LoRA policy with a LoRA policy


def run_option(option: str, hidden: int, layers: int, batch: int, length: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_agentic.algorithms.losses import clipped_value_loss
    from trl_agentic.trainers.critic import SharedValueHead, ValueModel

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4)
    policy = Qwen2ForCausalLM(config)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    if option in ("shared-adapter", "policy-only-lora"):
        policy = get_peft_model(policy, LoraConfig(**{**lora.to_dict(), "task_type": "CAUSAL_LM"}))
    critic = {
        "policy-only": lambda: None,
        "policy-only-lora": lambda: None,
        "separate": lambda: ValueModel.from_policy(policy),
        "separate-lora": lambda: ValueModel.from_policy(policy, peft_config=lora),
        "shared-head": lambda: SharedValueHead(policy),
        "shared-adapter": lambda: SharedValueHead(policy, adapter_config=lora),
    }[option]()
    ids = torch.randint(0, 32000, (batch, length))
    mask = torch.ones(batch, length // 2)
    logits = policy(input_ids=ids).logits
    loss = torch.log_softmax(logits.float(), -1).mean()
    if critic is not None:
        values = critic(ids, completion_length=length // 2)
        value_loss, _ = clipped_value_loss(values, values.detach() + 0.1, torch.zeros_like(values), mask, 0.2)
        loss = loss + value_loss
    loss.backward()
    params = sum(p.numel() for p in policy.parameters()) + (sum(p.numel() for p in critic.parameters()) if critic else 0)
    return {"option": option, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "parameters_m": params / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--option", choices=OPTIONS, help="measure this option in this process (one JSON line)")
    parser.add_argument("--options", nargs="+", choices=OPTIONS, default=list(OPTIONS),
                        help="the options to measure, each in its own process, with their baselines")
    args = parser.parse_args()
    if args.option:
        print(json.dumps(run_option(args.option, args.hidden, args.layers, args.batch, args.length)))
        return
    wanted = set(args.options) | {BASELINE.get(option, "policy-only") for option in args.options}
    rows = []
    for option in (option for option in OPTIONS if option in wanted):
        out = subprocess.run([sys.executable, __file__, "--option", option, "--hidden", str(args.hidden), "--layers",
                              str(args.layers), "--batch", str(args.batch), "--length", str(args.length)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    by_option = {row["option"]: row["peak_rss_mib"] for row in rows}
    print(f"{'option':<18}{'peak RSS MiB':>14}{'extra for the critic':>22}  (baseline)")
    for row in rows:
        baseline = BASELINE.get(row["option"], "policy-only")
        extra = f"{row['peak_rss_mib'] - by_option[baseline]:+.0f}" if baseline in by_option else "not measured"
        print(f"{row['option']:<18}{row['peak_rss_mib']:>14.0f}{extra:>22}  ({baseline})")


if __name__ == "__main__":
    main()
