"""What TRL's default ``bf16=True`` costs on a CPU: one training forward + backward of a random model of
SmolLM2-135M-Instruct's shape (a 135M-parameter Llama), in float32 and under bfloat16 autocast (what transformers'
``Trainer`` does with ``use_cpu=True, bf16=True``), alternating.

    python benchmarks/cpu_bf16.py [--batch 4] [--length 256] [--repeats 1]

Prints whether the CPU has bfloat16 in hardware, then the seconds of each step. On a CPU without it (no AVX512-BF16
or AMX) the autocast step is many times slower, which is why our configs leave ``bf16`` off on a CPU; on one with it,
autocast is the faster (docs/trl-differences.md has both machines' figures).
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trl_agentic.device import cpu_has_native_bf16

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True)  # SmolLM2-135M's config.json
    model = LlamaForCausalLM(config)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {args.batch} x {args.length}; "
          f"bfloat16 in hardware: {cpu_has_native_bf16()}")
    ids = torch.randint(0, config.vocab_size, (args.batch, args.length))
    for _ in range(args.repeats):
        for bf16 in (False, True):
            model.zero_grad()
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            print(f"{'bfloat16 autocast' if bf16 else 'float32':>17}: {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
