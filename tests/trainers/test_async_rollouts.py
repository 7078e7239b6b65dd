"""Asynchronous rollouts (``max_staleness=D``, ``trl_agentic/rollout/pipeline.py``): 0 is the synchronous
trainer bit for bit; D >= 1 trains both trainers D rounds behind the generator (staleness 0, 1, ..., D, D), with
every sample trained once or counted discarded, the copy's weights those of the version it reports, the behaviour
log-probs in the correction, and a failure of the background thread raised in ``train()`` with its traceback."""

import gc
import math
import os
import signal
import threading
import time
import traceback
import weakref

import pytest
import torch
from conventions import build_convention
from helpers import agentic_args, assert_rounds_behind, lookup_dataset, ppo_args, raised_within
from peft import LoraConfig
from transformers import TrainerCallback

from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer
from trl_agentic.compat import TRLBatch
from trl_agentic.rollout.generation import Generation, HFGenerator
from trl_agentic.rollout.pipeline import (
    AsyncRollouts,
    BackgroundThread,
    CopyWeights,
    GenerationStopped,
    PolicyCopy,
    StoppableGenerator,
    generator_core,
    refusal,
    sharding_of,
    snapshot,
)
from trl_agentic.toy import LookupEnvironment, lookup_reward
from trl_agentic.trajectory import Trajectory, load_trajectories

STEPS = 3
DEEP_STEPS = 5  # max_staleness=2: two steps to fill the pipeline, then three at staleness 2
BATCH = 4  # agentic_args' per_device_train_batch_size: one round's samples


def agent_tokens_reward(completions, trajectory, **kwargs):
    return [t.num_agent_tokens / 10 for t in trajectory]


def _grpo(tmp_path, tiny_model_dir, tokenizer, peft_config=None, eval_dataset=None, **overrides):
    args = agentic_args(tmp_path, **{"max_steps": STEPS, **overrides})
    return AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[lookup_reward, agent_tokens_reward], args=args,
                              train_dataset=lookup_dataset(16), processing_class=tokenizer,
                              environment=LookupEnvironment, peft_config=peft_config, eval_dataset=eval_dataset)


def _logs(trainer):
    return [row for row in trainer.state.log_history if "loss" in row]


def _train_within(trainer, seconds=300.0):
    """``trainer.train()``'s exception; a failure if it still runs after ``seconds`` (the background failure hung it)."""
    return raised_within(trainer.train, seconds)


def test_max_staleness_0_is_the_synchronous_trainer_bit_for_bit(tiny_model_dir, tokenizer, tmp_path):
    results = []
    for name, overrides in (("default", {}), ("zero", {"max_staleness": 0})):
        trainer = _grpo(tmp_path / name, tiny_model_dir, tokenizer, beta=0.05, **overrides)
        assert not trainer.off_policy
        trainer.train()
        logs = [{k: v for k, v in row.items() if k not in ("train_runtime", "train_samples_per_second",
                                                           "train_steps_per_second", "step_time")}
                for row in trainer.state.log_history]
        params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        results.append((logs, params))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(results[0][1][n], results[1][1][n]) for n in results[0][1])
    assert not any(k.startswith("async/") for row in results[0][0] for k in row)


def test_grpo_one_round_behind_trains_every_sample_once(tiny_model_dir, tokenizer, tmp_path):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=1, beta=0.05,
                    trajectory_dir=str(tmp_path / "traj"))
    trainer.train()
    logs = _logs(trainer)
    assert len(logs) == STEPS
    assert all(math.isfinite(row["loss"]) for row in logs)
    assert [row["async/staleness"] for row in logs] == [0.0] + [1.0] * (STEPS - 1)
    assert all("sampling/importance_sampling_ratio/mean" in row and "clip_ratio/region_mean" in row for row in logs)
    pipeline = trainer.rollout_source
    # the first round's rows twice (once now, once ahead), then one round's per step; the last round's ahead at the end
    assert pipeline.started == BATCH * (STEPS + 1)
    assert pipeline.consumed == BATCH * STEPS
    assert pipeline.discarded == BATCH
    assert pipeline.started == pipeline.consumed + pipeline.discarded
    assert not pipeline.ahead
    rows = list(load_trajectories(tmp_path / "traj" / "trajectories-rank0.jsonl"))
    assert len(rows) == BATCH * STEPS  # each trained once
    assert [r["step"] - r["policy_version"] for r in rows] == [0] * BATCH + [1] * BATCH * (STEPS - 1)


def test_grpo_two_rounds_behind_trains_every_sample_once(tiny_model_dir, tokenizer, tmp_path):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=2, max_steps=DEEP_STEPS,
                    trajectory_dir=str(tmp_path / "traj"))
    trainer.train()
    assert_rounds_behind(trainer, DEEP_STEPS, BATCH, depth=2)  # staleness 0, 1, 2, 2, 2
    pipeline = trainer.rollout_source
    # the first round's rows three times (once now, twice ahead), then one round's per step; two rounds ahead at the end
    assert pipeline.started == BATCH * (DEEP_STEPS + 2)
    assert not pipeline.ahead
    rows = list(load_trajectories(tmp_path / "traj" / "trajectories-rank0.jsonl"))
    assert len(rows) == BATCH * DEEP_STEPS  # each trained once
    assert [r["step"] - r["policy_version"] for r in rows] == [s for s in (0, 1, 2, 2, 2) for _ in range(BATCH)]
    assert [r["policy_version"] for r in rows] == [v for v in (0, 0, 0, 1, 2) for _ in range(BATCH)]


@pytest.mark.parametrize(("depth", "steps"), [(1, STEPS), (2, DEEP_STEPS)])
def test_ppo_rounds_behind(tiny_model_dir, tokenizer, tmp_path, depth, steps):
    args = ppo_args(tmp_path, max_steps=steps, max_staleness=depth)
    trainer = AgenticPPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                                train_dataset=lookup_dataset(16), processing_class=tokenizer,
                                environment=LookupEnvironment)
    trainer.train()
    assert_rounds_behind(trainer, steps, BATCH, depth)


def test_dynamic_sampling_and_evaluation_roll_out_on_the_spot(tiny_model_dir, tokenizer, tmp_path):
    """Dynamic sampling's extra rounds and evaluation use the training model on the training thread, while the job
    ahead runs: the pipeline's counts are those of the training rounds alone."""
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=1, zero_variance_groups="dynamic_sampling",
                    eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4, eval_dataset=lookup_dataset(4))
    trainer.train()
    logs = _logs(trainer)
    assert len(logs) == STEPS and all(math.isfinite(row["loss"]) for row in logs)
    assert any("agentic/zero_variance/extra_rounds" in row for row in logs)
    assert sum("eval_loss" in row for row in trainer.state.log_history) == STEPS
    pipeline = trainer.rollout_source
    assert (pipeline.consumed, pipeline.discarded) == (BATCH * STEPS, BATCH)


@pytest.mark.parametrize(("use_lora", "depth"), [(False, 1), (True, 1), (False, 2)])
def test_the_copy_holds_the_weights_of_the_version_it_reports(tiny_model_dir, tokenizer, tmp_path, use_lora, depth):
    """Each job samples with the weights of the step it was started at, loaded when it starts: with two jobs queued,
    the one running is never overwritten by the next one's weights."""
    steps = STEPS + depth - 1  # a trained job sampled at version 1 or later
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=depth, learning_rate=1e-2, max_steps=steps,
                    peft_config=peft_config if use_lora else None)
    policy_at = {}  # global step -> the policy's parameters when that step begins

    class Snapshot(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            policy_at[state.global_step] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    trainer.add_callback(Snapshot())
    pipeline = trainer.rollout_source
    seam, sampled = pipeline.seam, []
    run = seam.run

    def recording_run(rows):  # on the background thread, when the job starts
        sampled.append((pipeline.weights.policy.version,
                        {n: p.detach().clone() for n, p in pipeline.weights.policy.model.named_parameters()}))
        return run(rows)

    seam.run = recording_run
    trainer.train()
    jobs = [0] * (depth + 1) + list(range(1, steps))  # the versions of every job started, in order
    assert len(sampled) >= steps  # the jobs trained; of those ahead at the end, a queued one never starts
    assert [version for version, _ in sampled] == jobs[:len(sampled)]
    for version, weights in sampled:
        assert all(torch.equal(weights[n], policy_at[version][n]) for n in weights)
    assert not all(torch.equal(sampled[-1][1][n], policy_at[0][n]) for n in policy_at[0])  # the policy moved


def test_the_correction_uses_the_behaviour_logprobs(tiny_model_dir, tokenizer, tmp_path):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=1, learning_rate=1e-2,
                    vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=100.0)
    trainer.train()
    logs = _logs(trainer)
    fresh, stale = logs[0], logs[1:]
    assert fresh["async/staleness"] == 0.0
    assert fresh["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert fresh["agentic/vllm_logprob_gap"] < 1e-4  # the copy sampled with the policy's weights
    for row in stale:
        assert row["async/staleness"] == 1.0
        assert row["agentic/vllm_logprob_gap"] > 1e-4
        assert row["sampling/importance_sampling_ratio/max"] - row["sampling/importance_sampling_ratio/min"] > 1e-4


class RecomputedBeside(AgenticGRPOTrainer):
    """Computes every micro-batch's loss both ways: with the proximal log-probs from the loss's own forward (what
    trains) and with them recomputed by a forward pass of their own, the correction applied in the round (recorded:
    both losses and their gradients)."""

    from_loss = True
    compared: list

    @property
    def proximal_in_loss(self):
        return self.from_loss

    def clipped_loss(self, model, batch, kl_estimator=None):
        trained = [p for p in model.parameters() if p.requires_grad]
        loss = super().clipped_loss(model, batch, kl_estimator)
        recomputed = TRLBatch(dict(batch.data))
        recomputed.old_logps = AgenticGRPOTrainer.policy_logps(self, model, recomputed)
        self.off_policy_correction(recomputed)
        self.from_loss = False
        try:
            reference = super().clipped_loss(model, recomputed, kl_estimator)
        finally:
            self.from_loss = True
        grads = torch.autograd.grad(loss, trained, retain_graph=True, allow_unused=True)
        reference_grads = torch.autograd.grad(reference, trained, allow_unused=True)
        self.compared.append((loss.item(), reference.item(), grads, reference_grads,
                              float(recomputed["importance_sampling_ratio"].std())))
        return loss


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_the_proximal_policy_from_the_loss_is_the_recomputed_one(tiny_model_dir, tokenizer, tmp_path, mode):
    """One optimizer step per round: the loss's own log-probs (detached) are the proximal policy's, so the round's
    forward pass that recomputes them is skipped (none runs) and every micro-batch's loss and gradient equal those
    with them recomputed and the correction applied in the round, within float error."""
    args = agentic_args(tmp_path, max_steps=2, max_staleness=1, learning_rate=1e-2,
                        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=100.0)
    trainer = RecomputedBeside(model=tiny_model_dir, reward_funcs=[lookup_reward, agent_tokens_reward], args=args,
                               train_dataset=lookup_dataset(16), processing_class=tokenizer,
                               environment=LookupEnvironment)
    trainer.compared = []
    in_round = []
    trainer.policy_logps = lambda *a, **k: in_round.append(1)  # the round's forward, if any: fails the loss below
    trainer.train()
    assert not in_round
    assert len(trainer.compared) == 2
    assert trainer.compared[-1][4] > 1e-3  # the weights differ across tokens: stale samples were corrected
    for loss, reference, grads, reference_grads, _ in trainer.compared:
        assert loss == pytest.approx(reference, rel=1e-5, abs=1e-6)
        for grad, expected in zip(grads, reference_grads, strict=True):
            if expected is None:
                assert grad is None
            else:
                torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)
    assert all("sampling/importance_sampling_ratio/mean" in row for row in _logs(trainer))


def test_a_policy_that_moves_before_the_loss_gets_its_proximal_forward(tiny_model_dir, tokenizer, tmp_path):
    """Two optimizer steps per round (``steps_per_generation`` twice the accumulation): the second micro-batch's
    proximal policy is not the loss's, so the round computes it (PPO's KL reward likewise reads it in the round)."""
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=1, steps_per_generation=2,
                    per_device_train_batch_size=2, max_steps=2)
    assert not trainer.proximal_in_loss
    forwards = []
    trainer.policy_logps = lambda *a, **k: forwards.append(1) or AgenticGRPOTrainer.policy_logps(trainer, *a, **k)
    trainer.train()
    assert len(forwards) == 1  # one round for the two steps
    assert "sampling/importance_sampling_ratio/mean" in _logs(trainer)[0]
    ppo_kl = AgenticPPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, processing_class=tokenizer,
                               args=ppo_args(tmp_path / "ppo", max_staleness=1, num_iterations=1),
                               train_dataset=lookup_dataset(8), environment=LookupEnvironment)
    assert ppo_kl.beta != 0.0 and not ppo_kl.proximal_in_loss


@pytest.mark.parametrize("correction", ["behaviour", "none"])
def test_the_other_corrections_train(tiny_model_dir, tokenizer, tmp_path, correction):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=1, async_correction=correction, max_steps=2)
    trainer.train()
    logs = _logs(trainer)
    assert len(logs) == 2 and all(math.isfinite(row["loss"]) for row in logs)
    assert all("sampling/importance_sampling_ratio/mean" not in row for row in logs)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_background_failure_is_raised_in_train_with_its_traceback(tiny_model_dir, tokenizer, tmp_path, monkeypatch,
                                                                    depth):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=depth, max_steps=4)
    generate = HFGenerator.generate
    calls = {"background": 0}

    def failing_generate(self, *args, **kwargs):
        if threading.current_thread().name == "trl-agentic-rollouts":
            calls["background"] += 1
            if calls["background"] > 2 * (depth + 1):  # the first round's jobs have run (<= 2 turns each here)
                raise KeyError("the generator's card fell over")
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFGenerator, "generate", failing_generate)
    error = _train_within(trainer)
    assert isinstance(error, KeyError) and "the generator's card fell over" in str(error)
    assert "failing_generate" in "".join(traceback.format_tb(error.__traceback__))  # the background frames
    assert trainer.state.global_step < 4
    pipeline = trainer.rollout_source
    assert not pipeline.ahead and pipeline.started == pipeline.consumed + pipeline.discarded
    assert pipeline.discarded == BATCH * depth  # the failed job and every job queued with it


def test_training_end_stops_the_generator(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=1, max_steps=2)
    generate = HFGenerator.generate
    calls = []

    def counting_generate(self, *args, **kwargs):
        if threading.current_thread().name == "trl-agentic-rollouts":
            calls.append(1)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFGenerator, "generate", counting_generate)
    trainer.train()
    after = len(calls)
    threading.Event().wait(0.5)
    assert len(calls) == after  # nothing generates once train() returned
    assert not trainer.rollout_source.ahead and trainer.rollout_source.discarded == BATCH
    trainer.train()  # a second train() starts the pipeline again
    assert trainer.rollout_source.started == trainer.rollout_source.consumed + trainer.rollout_source.discarded


def test_background_thread_keeps_order_and_exceptions():
    thread = BackgroundThread()
    first = thread.submit(lambda: threading.current_thread().name)
    second = thread.submit(lambda: 1 / 0)
    assert first.result(5) == "trl-agentic-rollouts"
    with pytest.raises(ZeroDivisionError):
        second.result(5)
    thread.close()
    thread.thread.join(5)
    assert not thread.thread.is_alive()


def test_the_background_thread_is_pinned_to_its_core():
    core = max(os.sched_getaffinity(0))
    thread = BackgroundThread(cpu=core)
    assert thread.submit(lambda: os.sched_getaffinity(0)).result(5) == {core}
    assert os.sched_getaffinity(0) != {core} or len(os.sched_getaffinity(0)) == 1  # this thread's left as it was
    thread.close()


class _OneToken:
    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        return [Generation(ids=[0], logprobs=[0.0]) for _ in prompts]


class _SlowSeam:
    """A rollout seam that makes ``calls`` generation calls 10 ms apart per batch."""

    def __init__(self, generator, calls):
        self.generator, self.calls = generator, calls

    def run(self, rows):
        for _ in range(self.calls):
            self.generator.generate([[1]], 1, [], [0])
            time.sleep(0.01)
        return [Trajectory(prompt_ids=[1]) for _ in rows], None


@pytest.mark.parametrize("depth", [1, 2])
def test_an_interrupted_wait_stops_the_job_and_the_pipeline_starts_again(depth):
    """Ctrl-C while the trainer waits for the job: the job ends at its next generation call, its samples and those of
    every job queued behind it are discarded, and the next round starts afresh."""
    stop = threading.Event()
    seam = _SlowSeam(StoppableGenerator(_OneToken(), stop), calls=300)
    model = torch.nn.Linear(2, 2)
    pipeline = AsyncRollouts(seam, CopyWeights(PolicyCopy(model)), stop, depth=depth)
    # Python's own Ctrl-C handler, set at the OS level too: once, in a loaded whole-suite run, this test saw no
    # KeyboardInterrupt (cause not found; signal.getsignal showed no test changing it: a C library could)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))  # a real Ctrl-C
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            pipeline.next([{}, {}], model, 0)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    stopped = pipeline._stopping
    with pytest.raises(GenerationStopped):
        stopped.result(2)  # well before its 300 calls (3 s)
    assert (pipeline.started, pipeline.discarded, list(pipeline.ahead)) == (2 * depth, 2 * depth, [])
    seam.calls = 2
    rollouts = pipeline.next([{}, {}], model, 1)
    assert len(rollouts.runs) == 2 and rollouts.version == 1 and not stop.is_set()
    pipeline.close()
    assert pipeline.started == pipeline.consumed + pipeline.discarded == 2 * depth + 2 * (depth + 1)


def test_stopping_a_running_job_keeps_nothing_of_the_caller_alive():
    """A job stopped while it runs ends in GenerationStopped, kept in its future. Raising it on the training thread
    would link the caller's frames to its traceback, and with them their locals: at the end of training the DDP
    wrapper, which holds the process group, kept gloo's threads alive past ``end_training`` (a CI failure of the
    two-process test). Neither the waiting nor the background thread may keep a reference to the caller's locals."""
    stop = threading.Event()
    seam = _SlowSeam(StoppableGenerator(_OneToken(), stop), calls=30)  # 0.3 s a job: the next still runs at stop()
    model = torch.nn.Linear(2, 2)
    pipeline = AsyncRollouts(seam, CopyWeights(PolicyCopy(model)), stop, depth=1)

    class Held:
        pass

    def training_loop():
        held = Held()  # what a caller's frame holds (the training loop's wrapped model)
        pipeline.next([{}], model, 0)  # the first round's own job, then one ahead, running
        time.sleep(0.05)
        pipeline.stop()  # on_train_end: the running job stops at its next generation call
        return weakref.ref(held)

    held = training_loop()
    assert pipeline.discarded == 1 and not pipeline.ahead
    gc.collect()
    assert held() is None
    pipeline.close()


class _RecordingSeam:
    """A rollout seam whose runs carry each row's ``k`` and the copy's version when the job started; a row with
    ``fail`` raises instead."""

    def __init__(self, policy):
        self.policy = policy

    def run(self, rows):
        if any(row.get("fail") for row in rows):
            raise RuntimeError("the environment fell over")
        return [Trajectory(prompt_ids=[row["k"], self.policy.version]) for row in rows], None


def _recording_pipeline(depth):
    model = torch.nn.Linear(2, 2)
    policy = PolicyCopy(model)
    return AsyncRollouts(_RecordingSeam(policy), CopyWeights(policy), threading.Event(), depth=depth), model


@pytest.mark.parametrize(("depth", "trained"), [
    (1, [(0, 0), (0, 0), (1, 1), (2, 2), (3, 3)]),  # as the one-round pipeline always trained
    (2, [(0, 0), (0, 0), (0, 0), (1, 1), (2, 2)]),
])
def test_each_round_trains_the_oldest_job(depth, trained):
    """Round ``k`` trains rows_{k-D}'s runs, sampled at version k-D (the first rounds: the first rows' extra runs),
    and the pipeline holds D jobs ahead after each round."""
    pipeline, model = _recording_pipeline(depth)
    seen = []
    for k in range(5):
        rollouts = pipeline.next([{"k": k}], model, k)
        seen.append((rollouts.rows[0]["k"], rollouts.version))
        assert [list(run.prompt_ids) for run in rollouts.runs] == [[rollouts.rows[0]["k"], rollouts.version]]
        assert all(run.policy_version == rollouts.version for run in rollouts.runs)
        assert len(pipeline.ahead) == depth
    assert seen == trained
    pipeline.close()
    assert (pipeline.started, pipeline.consumed, pipeline.discarded) == (5 + depth, 5, depth)


def test_a_failure_of_any_job_ahead_is_raised_after_the_step():
    """Two jobs ahead, the newer fails: it is raised after the optimizer step (not only the oldest job is checked),
    and both are discarded."""
    pipeline, model = _recording_pipeline(depth=2)
    pipeline.next([{"k": 0}], model, 0)
    pipeline.next([{"k": 1, "fail": True}], model, 1)
    pipeline.ahead[-1].future.exception(5)  # the failing job has run
    with pytest.raises(RuntimeError, match="the environment fell over"):
        pipeline.raise_failure()
    assert not pipeline.ahead and pipeline.started == pipeline.consumed + pipeline.discarded
    assert pipeline.discarded == 2


def test_the_copy_loads_a_snapshot_of_the_weights_of_its_submit():
    """The weights a job samples with are taken when it is submitted: training moving the policy meanwhile does not
    reach them."""
    model = torch.nn.Linear(2, 2)
    policy = PolicyCopy(model)
    weights = snapshot(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    policy.load(weights, version=3)
    assert torch.equal(policy.model.weight, weights["weight"]) and not torch.equal(policy.model.weight, model.weight)
    assert policy.version == 3


def test_settings_it_cannot_run_are_refused(tmp_path):
    assert agentic_args(tmp_path, max_staleness=3).max_staleness == 3
    for value in (-1, True, 1.5):
        with pytest.raises(ValueError, match="max_staleness must be an integer >= 0"):
            agentic_args(tmp_path, max_staleness=value)
    with pytest.raises(ValueError, match="async_correction must be one of"):
        agentic_args(tmp_path, max_staleness=1, async_correction="tis")
    assert "FSDP" in refusal("FSDP", False) and "pass max_staleness=0" in refusal("FSDP", False)
    assert "concurrent_sync_tools=True" in refusal(None, True)  # sync tools on the training thread
    assert refusal(None, False) is None


def test_sharded_parameters_are_named():
    """Several processes are run (no collective call leaves the training thread); what shards the parameters, whose
    unwrapped model a copy would not hold, is named for the refusal."""
    from types import SimpleNamespace

    def state(deepspeed=None, fsdp=None):
        return SimpleNamespace(deepspeed_plugin=deepspeed, fsdp_plugin=fsdp)

    assert sharding_of(state()) is None
    assert sharding_of(state(deepspeed=SimpleNamespace(zero_stage=2))) is None
    assert sharding_of(state(deepspeed=SimpleNamespace(zero_stage=3))) == "DeepSpeed ZeRO-3"
    assert sharding_of(state(fsdp=object())) == "FSDP"


def test_each_process_pins_its_generator_to_a_core_of_its_own():
    assert generator_core(None, 1, {0}) is None
    assert [generator_core(4, index, set(range(8))) for index in range(3)] == [4, 5, 6]
    with pytest.raises(ValueError, match=r"^generator_cpu=1 \+ local process index 1 = core 2 is not a core of this "
                                         r"machine \(0, 1\): pass generator_cpu=None or a smaller core$"):
        generator_core(1, 1, {0, 1})


def _increment_run(tmp_path, **extra):
    from test_trl_environments import IncrementEnv, increment_dataset  # TRL's documented example

    from trl_agentic import AgenticGRPOConfig

    qwen = build_convention("qwen2.5-instruct")
    data = increment_dataset()
    args = AgenticGRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                             max_completion_length=32, max_steps=STEPS, learning_rate=1e-3, report_to="none",
                             use_cpu=True, bf16=False, seed=0, save_strategy="no", logging_steps=1, **extra)
    return AgenticGRPOTrainer(model=qwen.load_model(), processing_class=qwen.load_tokenizer(), train_dataset=data,
                              reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                              environment_factory=IncrementEnv)


@pytest.mark.parametrize("generator", ["thread", "process"])
def test_trl_environment_factory_one_round_behind(tmp_path, generator):
    trainer = _increment_run(tmp_path, max_staleness=1, concurrent_sync_tools=True, async_generator=generator)
    trainer.train()
    logs = _logs(trainer)
    assert len(logs) == STEPS and all(math.isfinite(row["loss"]) for row in logs)
    assert [row["async/staleness"] for row in logs] == [0.0] + [1.0] * (STEPS - 1)
    assert all("rewards/IncrementEnv/mean" in row for row in logs)  # TRL's environments reached the rewards
    pipeline = trainer.rollout_source
    assert (pipeline.consumed, pipeline.discarded) == (2 * STEPS, 2)


def test_trl_sync_tools_on_the_training_thread_are_refused(tmp_path):
    with pytest.raises(ValueError, match="concurrent_sync_tools=True"):
        _increment_run(tmp_path, max_staleness=1)


async def one_call_agent(client, prompt, **row):
    """An agent of the OpenAI SDK: one request to the policy, its text returned."""
    reply = await client.chat.completions.create(model="policy", messages=prompt, max_tokens=8)
    return reply.choices[0].message.content


@pytest.mark.parametrize("generator", ["thread", "process"])
def test_an_agent_through_the_endpoint_one_round_behind(tmp_path, generator):
    from datasets import Dataset

    from trl_agentic import AgenticGRPOConfig

    qwen = build_convention("qwen2.5-instruct")
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {i} plus 3?"}] for i in range(8)]})
    args = AgenticGRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                             max_completion_length=32, max_tokens_per_turn=8, max_steps=STEPS, learning_rate=1e-3,
                             report_to="none", use_cpu=True, bf16=False, seed=0, save_strategy="no", logging_steps=1,
                             max_staleness=1, async_generator=generator)
    trainer = AgenticGRPOTrainer(model=qwen.load_model(), processing_class=qwen.load_tokenizer(), train_dataset=data,
                                 reward_funcs=lambda completions, agent_output, **kw: [float(len(o or "")) for o in
                                                                                      agent_output],
                                 args=args, agent=one_call_agent)
    trainer.train()
    logs = _logs(trainer)
    assert len(logs) == STEPS and all(math.isfinite(row["loss"]) for row in logs)
    assert [row["async/staleness"] for row in logs] == [0.0] + [1.0] * (STEPS - 1)
    assert all(row["agentic/agent/segments_per_trajectory"] == 1.0 for row in logs)
    assert logs[0]["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)  # the copy's log-probs
    pipeline = trainer.rollout_source
    assert (pipeline.consumed, pipeline.discarded) == (2 * STEPS, 2)
