"""The generator in a process of its own (``async_generator="process"``, ``trl_agentic/rollout/process_generator.py``):
the same ids and log-probs as the in-process ``HFGenerator`` (a session's kept KV cache too), the weights written by
``PolicyCopy.load`` seen by the child's next call, both trainers one round behind with it (and GRPO two), a failure
or a death of the child raised in the trainer (never a hang), and no child left once training stops."""

import functools
import math
import os
import signal
import threading

import pytest
import torch
from helpers import agentic_args, assert_rounds_behind, fail_when_set, lookup_dataset, ppo_args, raised_within
from peft import LoraConfig, get_peft_model
from transformers import TrainerCallback

from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer
from trl_agentic.rollout.generation import HFGenerator
from trl_agentic.rollout.pipeline import PolicyCopy
from trl_agentic.rollout.process_generator import (
    GeneratorClosed,
    GeneratorProcessDied,
    GeneratorProcessError,
    ProcessGenerator,
)
from trl_agentic.toy import LookupEnvironment, build_tiny_model, lookup_reward

STEPS = 3
BATCH = 4  # agentic_args' per_device_train_batch_size
EOS = [2]
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM", init_lora_weights=False)


def _greedy(model):
    config = model.generation_config.__class__.from_dict(model.generation_config.to_dict())
    config.do_sample = False
    return config


def _gone(pid):
    """The process ``pid`` has ended and been reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def closing():
    """Generators made by a test, closed after it whatever happens."""
    made = []
    yield made
    for generator in made:
        generator.close()


def _pair(model, tokenizer, closing, **kwargs):
    """The in-process generator and the process one over the same copy of ``model`` (greedy, with log-probs). The
    same memory: a copy elsewhere (the policy itself) may differ in the last bits of a log-prob, as the kernels' order
    of summation depends on where a tensor lies (tried: the prefill of a GRPO group's shared prompt, 5e-7)."""
    policy = PolicyCopy(model)
    remote = ProcessGenerator(policy.model, tokenizer, _greedy(model), return_logprobs=True, **kwargs)
    local = HFGenerator(policy.model, tokenizer, _greedy(model), return_logprobs=True)  # now in shared memory
    closing.append(remote)
    return local, remote, policy


def _assert_same(a, b):
    assert [g.ids for g in a] == [g.ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    assert all(g.logprobs is not None and len(g.logprobs) == len(g.ids) for g in a)


PROMPTS = [[5, 9, 17, 23], [40, 41], [7, 8, 9, 10, 11, 12]]


@pytest.mark.parametrize("use_lora", [False, True])
def test_greedy_ids_and_logprobs_equal_the_in_process_generator(tokenizer, closing, use_lora):
    model = build_tiny_model(tokenizer)
    if use_lora:
        model = get_peft_model(model, LORA)
    local, remote, _ = _pair(model, tokenizer, closing)
    _assert_same(local.generate(PROMPTS, 6, [], EOS), remote.generate(PROMPTS, 6, [], EOS))


def test_a_session_keeps_the_kv_cache_across_turns_in_the_child(tokenizer, closing):
    model = build_tiny_model(tokenizer)
    local, remote, _ = _pair(model, tokenizer, closing)
    with local.session(), remote.session():
        group = list(range(5, 25))
        prompts = [group, list(group), list(range(40, 60))]  # a GRPO group of two: its prompt prefilled once
        for turn in range(3):
            a, b = local.generate(prompts, 4, [], EOS), remote.generate(prompts, 4, [], EOS)
            _assert_same(a, b)
            prompts = [p + g.ids + [30 + turn, 31] for p, g in zip(prompts, a)]  # the observation after it
    assert remote.reused_tokens == local.reused_tokens > 0  # later turns prefilled only their new ids
    assert (remote.prefilled_tokens, remote.shared_tokens) == (local.prefilled_tokens, local.shared_tokens)
    assert local.shared_tokens > 0


def test_sampling_is_seeded(tokenizer, closing):
    model = build_tiny_model(tokenizer)
    runs = []
    for _ in range(2):
        generator = ProcessGenerator(PolicyCopy(model).model, tokenizer, return_logprobs=True, seed=3)
        closing.append(generator)
        runs.append([[g.ids for g in generator.generate(PROMPTS, 8, [], EOS)] for _ in range(2)])
    assert runs[0] == runs[1]  # the same calls after a start: the same samples
    assert runs[0][0] != runs[0][1]  # drawn, not greedy


@pytest.mark.parametrize("use_lora", [False, True])
def test_weights_loaded_into_the_copy_reach_the_child(tokenizer, closing, use_lora):
    model, trained = build_tiny_model(tokenizer, seed=0), build_tiny_model(tokenizer, seed=1)
    if use_lora:  # the adapters are what trains: the base weights are frozen and equal
        model, trained = get_peft_model(model, LORA), get_peft_model(build_tiny_model(tokenizer, seed=0), LORA)
        with torch.no_grad():
            for p in trained.parameters():
                if p.requires_grad:
                    p.mul_(-3.0)
    local, remote, policy = _pair(model, tokenizer, closing)
    before = remote.generate(PROMPTS, 6, [], EOS)
    policy.load(trained, version=1)  # the child is idle: in place, into the shared memory it reads
    after = remote.generate(PROMPTS, 6, [], EOS)
    trained_weights = dict(trained.named_parameters())
    assert all(torch.equal(p, trained_weights[n]) for n, p in policy.model.named_parameters())
    _assert_same(local.generate(PROMPTS, 6, [], EOS), after)  # the trained weights, as the trainer process reads them
    assert [g.logprobs for g in before] != [g.logprobs for g in after]


def _raised_within(call, seconds=20.0):
    """The exception ``call()`` raises; a failure if it still waits for the generator process after ``seconds``."""
    return raised_within(call, seconds)


def _flagged(policy_model, action):
    """A shared flag whose setting makes the model's next forward in the child ``action`` (helpers.fail_when_set)."""
    flag = torch.zeros(2).share_memory_()
    policy_model.register_forward_pre_hook(functools.partial(fail_when_set, flag, action))
    return flag


def test_an_exception_in_the_child_is_raised_with_its_traceback(tokenizer, closing):
    model = build_tiny_model(tokenizer)
    _, remote, policy = _pair(model, tokenizer, closing)
    flag = _flagged(policy.model, "raise")
    remote.generate(PROMPTS, 2, [], EOS)
    flag[0] = 1
    with pytest.raises(GeneratorProcessError, match="KeyError: \"the generator's card fell over\"") as error:
        remote.generate(PROMPTS, 2, [], EOS)
    assert "the generator process's traceback" in str(error.value) and "fail_when_set" in str(error.value)
    flag[0] = 0
    assert len(remote.generate(PROMPTS, 2, [], EOS)) == 3  # the child lives on


@pytest.mark.parametrize("how", ["kill itself", "killed from outside"])
def test_a_child_that_dies_is_a_one_line_error_not_a_hang(tokenizer, closing, how):
    model = build_tiny_model(tokenizer)
    _, remote, policy = _pair(model, tokenizer, closing)
    flag = _flagged(policy.model, "kill" if how == "kill itself" else "sleep")
    remote.generate(PROMPTS, 2, [], EOS)
    pid = remote.pid
    flag[0] = 1
    if how == "killed from outside":  # while the call waits for it
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    error = _raised_within(lambda: remote.generate(PROMPTS, 2, [], EOS))
    assert isinstance(error, GeneratorProcessDied)
    assert str(error) == f"the generator process (pid {pid}) died during a call: killed by signal SIGKILL"
    flag[0] = 0
    assert len(remote.generate(PROMPTS, 2, [], EOS)) == 3 and remote.pid != pid  # the next call starts another


def test_a_dead_child_whose_pipe_stays_open_is_a_one_line_error_not_a_hang(tokenizer, closing):
    """A process the child started (a library's helper) outlives it with the child's files open: the pipe never
    reaches its end, and only the check that the child is alive ends the wait."""
    model = build_tiny_model(tokenizer)
    _, remote, policy = _pair(model, tokenizer, closing)
    flag = _flagged(policy.model, "orphan")
    remote.generate(PROMPTS, 2, [], EOS)
    pid = remote.pid
    flag[0] = 1
    try:
        error = _raised_within(lambda: remote.generate(PROMPTS, 2, [], EOS))
    finally:
        if flag[1]:
            os.kill(int(flag[1]), signal.SIGKILL)
    assert isinstance(error, GeneratorProcessDied)
    assert str(error) == f"the generator process (pid {pid}) died during a call: killed by signal SIGKILL"


def test_close_ends_the_child_and_a_waiting_call(tokenizer, closing):
    model = build_tiny_model(tokenizer)
    _, remote, policy = _pair(model, tokenizer, closing)
    flag = _flagged(policy.model, "sleep")
    remote.generate(PROMPTS, 2, [], EOS)
    pid = remote.pid
    flag[0] = 1
    closer = threading.Timer(0.5, remote.close)
    closer.start()
    assert isinstance(_raised_within(lambda: remote.generate(PROMPTS, 2, [], EOS)), GeneratorClosed)
    closer.join()
    assert remote.pid is None and _gone(pid)
    with pytest.raises(GeneratorClosed):  # no call starts another (a job still running when training stopped)
        remote.generate(PROMPTS, 2, [], EOS)
    assert remote.pid is None
    flag[0] = 0
    remote.reopen()
    assert len(remote.generate(PROMPTS, 2, [], EOS)) == 3 and remote.pid not in (None, pid)


def _grpo(tmp_path, tiny_model_dir, tokenizer, **overrides):
    args = agentic_args(tmp_path, **{"max_steps": STEPS, "max_staleness": 1, "async_generator": "process",
                                     **overrides})
    return AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                              train_dataset=lookup_dataset(16), processing_class=tokenizer,
                              environment=LookupEnvironment)


def _logs(trainer):
    return [row for row in trainer.state.log_history if "loss" in row]


class _Pids(TrainerCallback):
    """The generator process's pid at every step's end."""

    def __init__(self, generator):
        self.generator, self.pids = generator, []

    def on_step_end(self, args, state, control, **kwargs):
        self.pids.append(self.generator.pid)


def _process_generator(trainer):
    return trainer.rollout_source.generator_process


def test_grpo_one_round_behind_with_the_process_generator(tiny_model_dir, tokenizer, tmp_path):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer)
    generator = _process_generator(trainer)
    assert isinstance(generator, ProcessGenerator) and generator.pid is None  # started at the first rollout
    pids = _Pids(generator)
    trainer.add_callback(pids)
    trainer.train()
    assert_rounds_behind(trainer, STEPS, BATCH)
    assert len(set(pids.pids)) == 1 and pids.pids[0] != os.getpid()  # one child served every round
    assert generator.pid is None and _gone(pids.pids[0])  # training's end ended it
    trainer.train()  # a second train() starts another
    assert len(set(pids.pids[STEPS:])) == 1 and pids.pids[STEPS] != pids.pids[0] and _gone(pids.pids[STEPS])
    pipeline = trainer.rollout_source
    assert pipeline.started == pipeline.consumed + pipeline.discarded == 2 * BATCH * (STEPS + 1)


def test_ppo_one_round_behind_with_the_process_generator(tiny_model_dir, tokenizer, tmp_path):
    args = ppo_args(tmp_path, max_steps=STEPS, max_staleness=1, async_generator="process")
    trainer = AgenticPPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                                train_dataset=lookup_dataset(16), processing_class=tokenizer,
                                environment=LookupEnvironment)
    pids = _Pids(_process_generator(trainer))
    trainer.add_callback(pids)
    trainer.train()
    assert_rounds_behind(trainer, STEPS, BATCH)
    assert _gone(pids.pids[0])


def test_grpo_two_rounds_behind_with_the_process_generator(tiny_model_dir, tokenizer, tmp_path):
    """Two jobs queued: each loads its own weights into the shared copy when it starts, while the child is idle."""
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=2, max_steps=4)
    pids = _Pids(_process_generator(trainer))
    trainer.add_callback(pids)
    trainer.train()
    assert_rounds_behind(trainer, 4, BATCH, depth=2)
    assert len(set(pids.pids)) == 1 and _gone(pids.pids[0])


def test_grpo_with_lora_and_the_process_generator(tiny_model_dir, tokenizer, tmp_path):
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward,
                                 args=agentic_args(tmp_path, max_steps=2, max_staleness=1, async_generator="process"),
                                 train_dataset=lookup_dataset(16), processing_class=tokenizer,
                                 environment=LookupEnvironment, peft_config=LORA)
    trainer.train()
    logs = _logs(trainer)
    assert [row["async/staleness"] for row in logs] == [0.0, 1.0] and all(math.isfinite(r["loss"]) for r in logs)


def _train_within(trainer, seconds=120.0):
    """``trainer.train()``'s exception; a failure if it still runs after ``seconds`` (the child's failure hung it)."""
    return raised_within(trainer.train, seconds)


@pytest.mark.parametrize("action", ["raise", "kill"])
def test_a_child_failure_is_raised_in_train_and_no_child_is_left(tiny_model_dir, tokenizer, tmp_path, action):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_steps=5)
    generator = _process_generator(trainer)
    flag = _flagged(trainer.rollout_source.weights.policy.model, action)
    pids = _Pids(generator)
    trainer.add_callback(pids)

    class Fail(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            flag[0] = 1  # the rollouts ahead fail at their next forward

    trainer.add_callback(Fail())
    error = _train_within(trainer)
    if action == "raise":
        assert isinstance(error, GeneratorProcessError)
        assert "KeyError" in str(error) and "the generator process's traceback" in str(error)
    else:
        assert isinstance(error, GeneratorProcessDied) and "killed by signal SIGKILL" in str(error)
        assert "\n" not in str(error)
    assert trainer.state.global_step < 5
    pipeline = trainer.rollout_source
    assert not pipeline.ahead and pipeline.started == pipeline.consumed + pipeline.discarded
    assert generator.pid is None and _gone(pids.pids[0])


def test_ctrl_c_during_training_ends_the_child(tiny_model_dir, tokenizer, tmp_path):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_steps=50)
    pids = _Pids(_process_generator(trainer))
    trainer.add_callback(pids)

    class CtrlC(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, during an optimizer step's callbacks

    trainer.add_callback(CtrlC())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert _process_generator(trainer).pid is None and _gone(pids.pids[0])


def test_close_ends_the_pipeline_and_its_child(tiny_model_dir, tokenizer, tmp_path):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_steps=1)
    pipeline = trainer.rollout_source
    rollouts = pipeline.next([dict(row) for row in lookup_dataset(4)], trainer.model, 0)
    assert len(rollouts.runs) == 4 and pipeline.ahead
    pid = _process_generator(trainer).pid
    pipeline.close()
    assert not pipeline.ahead and _gone(pid)
    assert pipeline.started == pipeline.consumed + pipeline.discarded


def test_max_staleness_0_builds_no_generator(tiny_model_dir, tokenizer, tmp_path):
    trainer = _grpo(tmp_path, tiny_model_dir, tokenizer, max_staleness=0)
    assert not trainer.off_policy


def test_an_unknown_generator_is_refused(tmp_path):
    with pytest.raises(ValueError, match="async_generator must be one of"):
        agentic_args(tmp_path, max_staleness=1, async_generator="gpu")
