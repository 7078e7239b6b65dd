"""How does a two-process CPU (gloo) run end after training: cleanly, aborted at exit, or hung?

    python benchmarks/distributed_exit.py --runs 20

Each run launches ``accelerate launch --multi_gpu --num_processes 2`` on a 3-step DDP script (a ``Linear(4, 4)``, an
``accelerator.gather`` per step as the trainers do), ending in one of three ways:

- ``destroy``: ``accelerator.end_training()`` alone (the DDP wrapper keeps the group and gloo's threads alive);
- ``destroy, free``: then the prepared model is dropped and ``accelerator.free_memory()`` called;
- ``barrier, settle, destroy, free``: a barrier and one second without the GIL first (``trainer.end_training()``).

The variants (``--variants``, default all three) alternate in one loop, so they share the machine's load. A run that
outlasts ``--timeout`` counts as hung (its process group is killed); a non-zero exit code as failed, and those that
printed "terminate called without an active exception" as aborted.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = """
import time
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
    accelerator.gather(torch.randn(3))
"""
SETTLE = """
accelerator.wait_for_everyone()
time.sleep(1.0)
"""
DESTROY = """
accelerator.end_training()
"""
FREE = """
del model, optimizer
accelerator.free_memory()
"""
VARIANTS = {
    "destroy": TRAIN + DESTROY,
    "destroy, free": TRAIN + DESTROY + FREE,
    "barrier, settle, destroy, free": TRAIN + SETTLE + DESTROY + FREE,
}
ABORT = "terminate called without an active exception"


def launch(script: Path, timeout: float) -> str:
    """``ok``, ``aborted``, ``failed`` or ``hung``."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "hung"
    if proc.returncode == 0:
        return "ok"
    return "aborted" if ABORT in output else "failed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as hung")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="VARIANT",
                        help="the endings to run (quoted names, default all: " + "; ".join(VARIANTS) + ")")
    args = parser.parse_args()
    counts = {name: {"ok": 0, "aborted": 0, "failed": 0, "hung": 0} for name in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        scripts = {}
        for k, name in enumerate(args.variants):
            scripts[name] = Path(tmp) / f"variant{k}.py"
            scripts[name].write_text(VARIANTS[name])
        for run in range(1, args.runs + 1):
            for name, script in scripts.items():
                counts[name][launch(script, args.timeout)] += 1
            print(f"after {run} runs: " + "; ".join(f"{n}: {c}" for n, c in counts.items()), flush=True)
    for name, c in counts.items():
        print(f"{name}: {c['ok']} of {args.runs} ended cleanly, {c['aborted']} aborted at exit, {c['hung']} hung, "
              f"{c['failed']} failed otherwise")


if __name__ == "__main__":
    main()
