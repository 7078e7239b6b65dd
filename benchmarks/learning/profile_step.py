"""Where does the time of one RL step on the learning benchmark go? Seconds per trainer method, per step.

    python benchmarks/learning/profile_step.py ppo --steps 2 --sft-adapter runs/learning/d16/sft/adapter

Runs the ``grpo`` or ``ppo`` stage of ``run.py`` (same model, task and settings; other options go to ``run.py``) for
``--steps`` steps without the final evaluation or the held-out curve (``--eval-every`` is 0), and after each optimizer
step prints the peak resident memory and the seconds spent in: the rollout (``RolloutEngine.run``), scoring a round
(``generation_round``, the rollout included), ``training_batch`` (scoring plus, for PPO, the critic's values and GAE),
``policy_logps`` (a forward pass for sampling-time log-probs), ``_critic_values``, ``loss`` (the policy's forward and,
for PPO, the critic's), ``backward`` and the whole ``training_step``. Nested calls are counted in each enclosing one.
"""

from __future__ import annotations

import argparse
import collections
import functools
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402  (benchmarks/learning/run.py)

seconds: dict[str, float] = collections.defaultdict(float)


def timed(cls: type, name: str) -> None:
    """Accumulate the wall time of ``cls.<name>`` in ``seconds[name]``."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - start

    setattr(cls, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo", choices=["grpo", "ppo"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sft-adapter", type=Path, default=Path("runs/learning/d16/sft/adapter"),
                        help="the SFT adapter the RL stage starts from (run.py's sft stage writes it)")
    parser.add_argument("--out", type=Path, default=Path("runs/learning/profile"))
    args, passed_on = parser.parse_known_args()  # the rest: run.py's options

    import accelerate
    from transformers import TrainerCallback

    from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer
    from trl_agentic.rollout.engine import RolloutEngine

    run_args = run.make_parser().parse_args(  # the last --eval-every wins: no held-out curve
        ["--out", str(args.out), "--rl-steps", str(args.steps), "--rl-lr", "1e-4", *passed_on, "--eval-every", "0"])
    if not (run_args.out / "sft" / "adapter").exists():
        shutil.copytree(args.sft_adapter, run_args.out / "sft" / "adapter")
    # the two trainers are siblings (over AgenticTrainer): the one that runs is timed, on its own class
    trainer_cls = AgenticPPOTrainer if args.algo == "ppo" else AgenticGRPOTrainer
    timed(RolloutEngine, "run")
    for name in ("generation_round", "training_batch", "policy_logps", "loss", "training_step"):
        timed(trainer_cls, name)
    timed(AgenticPPOTrainer, "_critic_values")
    timed(accelerate.Accelerator, "backward")

    class Report(TrainerCallback):
        def on_step_end(self, _args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
            print(f"step {state.global_step}: peak RSS {peak_gb:.2f} GB; seconds "
                  + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()), flush=True)
            seconds.clear()

    original_init = trainer_cls.__init__

    def init_with_report(self: Any, *a: Any, **k: Any) -> None:
        original_init(self, *a, **k)
        self.add_callback(Report())

    trainer_cls.__init__ = init_with_report
    run.evaluate_stage = lambda *a, **k: {"em": float("nan")}  # training only
    run.set_determinism(run_args.seed, run_args.threads, run_args.device)
    run.run_rl(run.Task(run_args), run_args, args.algo)


if __name__ == "__main__":
    main()
