"""How often does a two-process CPU (gloo) run abort at exit after training, with and without freeing the DDP wrapper?

    python benchmarks/distributed_exit.py --runs 20

Each run launches ``accelerate launch --multi_gpu --num_processes 2`` on a 3-step DDP script (a ``Linear(4, 4)``),
ending with ``accelerator.end_training()`` ("destroy only"), then the same script that also drops the prepared model
and calls ``accelerator.free_memory()`` ("destroy and free", what ``trainer.end_training()`` does). The two variants
alternate in one loop, so they share the machine's load. A failed run is a non-zero exit code; the script prints how
many failed and how many of those printed "terminate called without an active exception".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = """
import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for _ in range(3):
    accelerator.backward(model(torch.randn(2, 4)).sum())
    optimizer.step()
    optimizer.zero_grad()
accelerator.end_training()
"""
FREE = """
del model, optimizer
accelerator.free_memory()
"""
ABORT = "terminate called without an active exception"


def launch(script: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"destroy only": Path(tmp) / "destroy.py", "destroy and free": Path(tmp) / "free.py"}
        variants["destroy only"].write_text(SCRIPT)
        variants["destroy and free"].write_text(SCRIPT + FREE)
        failed = dict.fromkeys(variants, 0)
        aborted = dict.fromkeys(variants, 0)
        for run in range(1, args.runs + 1):
            for name, script in variants.items():
                proc = launch(script)
                failed[name] += proc.returncode != 0
                aborted[name] += ABORT in proc.stderr + proc.stdout
            print(f"after {run} runs: " + ", ".join(f"{n}: {failed[n]} failed" for n in variants), flush=True)
    for name in variants:
        print(f"{name}: {failed[name]} of {args.runs} runs failed, {aborted[name]} with '{ABORT}'")


if __name__ == "__main__":
    main()
