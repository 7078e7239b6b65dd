"""Asynchronous rollouts (``max_staleness`` 1, or more) against synchronous ones on the same split of two CPU cores:
step throughput of ``AgenticGRPOTrainer`` on the toy lookup task with a random tiny Qwen2.

    python benchmarks/async_rollouts.py [--loads 8 24 64] [--steps 8] [--batch 8] [--hidden 64] [--layers 2]
                                        [--generator thread process] [--max-staleness 1 2] [--repeats 3]
                                        [--cores 0 1] [--json out.json]

The split: the training thread is pinned to the first core (``os.sched_setaffinity`` on the main thread, before
anything starts), the background generator's thread to the second (``generator_cpu``), one torch thread each
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``). Synchronous (``max_staleness=0``) generation and training
take turns, as they would on the split (the generator's core then idles), so it runs on the first core alone;
asynchronous, the next round rolls out on the second core while this one trains on the first. ``--generator``: where
the asynchronous run's copy generates (``async_generator``): ``thread``, the background thread (sharing the GIL with
training), and/or ``process``, a child process pinned to the second core too (its forward passes; the rollout loop
stays on the background thread).

A load is the number of tokens per model turn (``max_tokens_per_turn``; a random model rarely ends a turn early):
generation's share of a step grows with it, training's is fixed by the batch. For each load, one after the other in
this process: the synchronous run, then an asynchronous one per ``--generator`` and ``--max-staleness``, each
``--steps`` optimizer steps. Prints one JSON line per load, generator and staleness (``load``, ``generator``,
``max_staleness``, ``sync_step_s`` and ``async_step_s``: the median seconds per step once the pipeline is full (from
the step after the first ``max(2, 1 + max_staleness)``; with ``--repeats R`` the load's runs are repeated R times, one
after another, and each figure is the median over the repeats, ``speedup`` the median of each repeat's ratio: a
shared machine drifts between runs), ``rollout_share``: the share of a synchronous step spent rolling out,
``speedup``: sync / async step time, at most 2 on two cores; ``sync_rollout_s`` and ``async_rollout_s``: a round's
rollout, synchronous and in the background beside training; the synchronous figures are the load's one run) and a
table; ``--json`` writes them all.

First, the split probe (``split_efficiency``, :func:`split_probe`): how much one ``generate`` call on the generator
core slows down while another process trains on the training core. On a machine whose two cores are not independent
(this project's: two KVM vCPUs shared with other jobs) it bounds the speed-up whatever the pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: the background thread's OpenMP pool too


def run(load: int, staleness: int, args: argparse.Namespace, out: str, generator: str = "thread") -> dict[str, float]:
    """Seconds per optimizer step (median after the first two) and per rollout (median after the first two:
    synchronous, the rollout stage; asynchronous, the background job, beside training from the third job on);
    ``generator``: the asynchronous run's ``async_generator``."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer
    from trl_agentic.toy import LookupEnvironment, build_tiny_model, build_tokenizer, lookup_reward
    from trl_agentic.toy.task import make_lookup_dataset

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers)
    data = Dataset.from_list(make_lookup_dataset(4 * args.batch * args.steps))
    config = AgenticGRPOConfig(
        output_dir=out, per_device_train_batch_size=args.batch, num_generations=2, max_turns=args.turns,
        max_tokens_per_turn=load, max_completion_length=args.turns * (load + 16), max_steps=args.steps,
        learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True, bf16=False, seed=0,
        save_strategy="no", max_staleness=staleness, generator_cpu=args.cores[1] if staleness else None,
        async_generator=generator)
    def length(completions, trajectory, **_):  # spread within each group: every step has a gradient
        return [t.num_agent_tokens / load for t in trajectory]

    ends: list[float] = []
    rollouts: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    class TimedTrainer(AgenticGRPOTrainer):
        def rollout(self, rows, ahead=True):  # the synchronous rollout stage (AgenticTrainer.rollout)
            if self.off_policy:  # the background jobs are timed instead (below)
                return super().rollout(rows, ahead)
            start = time.perf_counter()
            try:
                return super().rollout(rows, ahead)
            finally:
                rollouts.append(time.perf_counter() - start)

    trainer = TimedTrainer(model=model, processing_class=tokenizer, reward_funcs=[lookup_reward, length], args=config,
                           train_dataset=data, environment=LookupEnvironment)
    if trainer.off_policy:  # time each background job (the rollout beside training)
        seam = trainer.rollout_source.seam
        run_rows = seam.run

        def timed_run(rows):
            start = time.perf_counter()
            try:
                return run_rows(rows)
            finally:
                rollouts.append(time.perf_counter() - start)

        seam.run = timed_run
    trainer.add_callback(Timer())
    trainer.remove_callback(ProgressCallback)  # no progress bar nor printed logs: this script prints its figures
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    steps = [b - a for a, b in zip(ends, ends[1:])][max(1, staleness):]  # once the pipeline is full
    result = {"step_s": statistics.median(steps)}
    if rollouts:
        result["rollout_s"] = statistics.median(rollouts[2:] or rollouts)
    return result


def _train_for(seconds: float, core: int, hidden: int, layers: int) -> None:
    """Forward, backward and an optimizer step of a random tiny Qwen2 on ``core`` for ``seconds`` (another process)."""
    import torch

    from trl_agentic.toy import build_tiny_model, build_tokenizer

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    model = build_tiny_model(build_tokenizer(), hidden_size=hidden, num_layers=layers)
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(5, 300, (8, 96))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def split_probe(args: argparse.Namespace, seconds: float) -> float:
    """What the split itself allows: the seconds of one ``generate`` call on the generator core alone, over those of
    the same call while another *process* trains on the training core (no shared interpreter: no GIL). 1.0: the two
    cores are independent; below, they share something (hyperthreads of one core, a busy host, memory bandwidth), and
    no pipeline on this split can reach 2x."""
    import multiprocessing

    import torch

    from trl_agentic.toy import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers)
    ids = torch.randint(5, 300, (args.batch, 24))

    def generate() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16,
                           do_sample=True, pad_token_id=tokenizer.pad_token_id)
        return time.perf_counter() - start

    os.sched_setaffinity(0, {args.cores[1]})
    try:
        generate()  # warm-up
        alone = statistics.median(generate() for _ in range(5))
        trainer = multiprocessing.get_context("spawn").Process(
            target=_train_for, args=(seconds + 30, args.cores[0], args.hidden, args.layers))
        trainer.start()
        time.sleep(seconds)  # the other process imports torch and starts training
        beside = statistics.median(generate() for _ in range(5))
        trainer.terminate()
        trainer.join()
    finally:
        os.sched_setaffinity(0, {args.cores[0]})
    return alone / beside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, nargs="+", default=[8, 24, 64], help="tokens per model turn")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (at least 4)")
    parser.add_argument("--batch", type=int, default=8, help="rollouts per step (groups of 2)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--generator", nargs="+", choices=["thread", "process"], default=["thread"],
                        help="where the asynchronous runs generate (async_generator): one run per choice")
    parser.add_argument("--max-staleness", type=int, nargs="+", default=[1],
                        help="the asynchronous runs' max_staleness: one run per value and generator")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each load (synchronous, then every asynchronous one), in turn; medians")
    parser.add_argument("--cores", type=int, nargs=2, default=None,
                        help="training core, generator core (default: the first two this process may use)")
    parser.add_argument("--probe-seconds", type=float, default=10.0,
                        help="split probe: seconds given the training process to start (0: no probe)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.steps < 3 + max(args.max_staleness):
        parser.error("--steps must be at least 3 + the largest --max-staleness (the first steps fill the pipeline)")
    allowed = sorted(os.sched_getaffinity(0))
    args.cores = args.cores or (allowed * 2)[:2]
    if len(set(args.cores)) < 2:
        print(f"warning: one core ({args.cores[0]}) for both threads: the speed-up means nothing", flush=True)
    os.sched_setaffinity(0, {args.cores[0]})  # the training thread; threads started later inherit it
    import torch

    torch.set_num_threads(1)
    split = round(split_probe(args, args.probe_seconds), 3) if args.probe_seconds > 0 else None
    print(json.dumps({"split_efficiency": split}), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as out:
        variants = [(g, d) for g in args.generator for d in args.max_staleness]
        for load in args.loads:
            repeats = []
            for _ in range(args.repeats):
                sync = run(load, 0, args, out)
                repeats.append([(sync, run(load, staleness, args, out, generator)) for generator, staleness in variants])
            for k, (generator, staleness) in enumerate(variants):
                pairs = [repeat[k] for repeat in repeats]

                def med(side: int, key: str) -> float:
                    return round(statistics.median(pair[side][key] for pair in pairs), 4)

                row = {"load": load, "generator": generator, "max_staleness": staleness, "repeats": args.repeats,
                       "sync_step_s": med(0, "step_s"), "async_step_s": med(1, "step_s"),
                       "sync_rollout_s": med(0, "rollout_s"), "async_rollout_s": med(1, "rollout_s"),
                       "rollout_share": round(statistics.median(s["rollout_s"] / s["step_s"] for s, _ in pairs), 3),
                       "speedup": round(statistics.median(s["step_s"] / a["step_s"] for s, a in pairs), 3),
                       "speedups": [round(s["step_s"] / a["step_s"], 3) for s, a in pairs]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"cores: training {args.cores[0]}, generator {args.cores[1]}; batch {args.batch}, {args.turns} turns, "
          f"hidden {args.hidden}, {args.layers} layers, {args.steps} steps; split efficiency {split} (generation alone "
          f"/ beside a training process; 1.0: independent cores)")
    print(f"{'tokens/turn':>11} {'generator':>9} {'staleness':>9} {'rollout share':>13} {'sync s/step':>11} "
          f"{'async s/step':>12} {'speed-up':>8} {'rollout s: sync':>15} {'async (beside training)':>23}")
    for row in rows:
        print(f"{row['load']:>11} {row['generator']:>9} {row['max_staleness']:>9} {row['rollout_share']:>13.2f} "
              f"{row['sync_step_s']:>11.3f} "
              f"{row['async_step_s']:>12.3f} {row['speedup']:>7.2f}x {row['sync_rollout_s']:>15.3f} "
              f"{row['async_rollout_s']:>23.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": args.cores, "split_efficiency": split, "batch": args.batch, "turns": args.turns,
                       "hidden": args.hidden, "layers": args.layers, "steps": args.steps, "loads": rows}, f, indent=1)


if __name__ == "__main__":
    main()
