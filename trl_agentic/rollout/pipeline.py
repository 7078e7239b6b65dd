"""Where a training round's rollouts come from: a *rollout source*, chosen once per trainer (:func:`rollout_source`).
The trainer asks it for each round's :class:`Rollouts` (the rows, their runs, TRL's environments, the policy version
that sampled them and whether their log-probs are the behaviour policy's, to correct against) and never asks which
source it has:

- :class:`SyncSource` (``max_staleness=0``, depth 0): each round's rows rolled out now, by the trainer's generator;
- :class:`AsyncRollouts` (``max_staleness=D``, any integer ``D >= 1``): the next D rounds' rollouts, every turn and
  tool, run on a background thread, on a copy of the policy, while this round trains (the rest of this docstring).

The pipeline, D rounds deep, at training round ``k`` with the rows TRL's sampler gave it (``rows_k``)::

    1 wait for the oldest job         rows_{k-D}'s runs, sampled by the copy at version v = k-D (its error, if any,
                                      is raised here, or after the optimizer step during which it happened,
                                      with the background thread's traceback)
    2 queue rows_k's job              with a snapshot of the trained parameters (detached clones; the version of the
                                      snapshot = the global step, k), on the background thread (pinned to
                                      ``generator_cpu``), through a rollout seam of its own over the copy (the same
                                      kind as the trainer's)
    3 train on rows_{k-D}'s runs      score, batch and log-probs on the training thread; staleness k - v = D

The background thread runs its jobs one after another, and each job first loads its snapshot into the copy: the
generator is idle then, so weights reach it between its calls, never during a job (with D jobs queued, the copy
cannot be written when a job is queued: one before it may still run). A snapshot costs one copy of the trained
parameters (the adapters alone with PEFT) per job queued.

The first round has no job ahead: its rows are rolled out once to train on at once (staleness 0) and D more times
ahead, for the next D rounds, so that staleness goes 0, 1, ..., D, then stays D. The rows of round ``k+1`` reach the
trainer only at that round (TRL's sampler), so a pipeline D rounds deep needs these D batches more; no sample is
trained twice. When training ends (or a round raises) every job ahead is discarded: the queued ones never start,
the running one is stopped at its next generation call; every sample started is consumed (trained) or discarded.

Off-policy correction (``async_correction``; :meth:`~trl_agentic.trainers.base.AgenticTrainer.add_logps`) uses the
log-probs the copy's generator returned when it sampled (the behaviour policy), carried in each run's ``logprobs``
as vLLM's are, through the same batch key (``sampling_per_token_logps``) and TRL's weight
(:func:`~trl_agentic.algorithms.importance.vllm_importance_sampling_ratio`), against the proximal policy (the
weights of now: the loss's own log-probs when the policy does not move within a round,
:attr:`~trl_agentic.trainers.base.AgenticTrainer.proximal_in_loss`).

Where the copy generates (``async_generator``): on the background thread itself (``"thread"``), or in a child
process (``"process"``: :class:`~trl_agentic.rollout.process_generator.ProcessGenerator`, whose forward passes do not
share the GIL with training; the copy's weights are in shared memory, so a job's load writes what the child reads),
which the pipeline ends whenever it stops; the rollout loop stays on the background thread either way.

vLLM's server instead of a copy (``use_vllm=True, vllm_mode="server"``, :class:`ServerWeights`): the background
thread sends this process's prompts to the server (:class:`~trl_agentic.rollout.vllm.VLLMServerGenerator`), and the
trainer pushes the weights of version k on the training thread when it queues round k's job, after every process's
job ahead has ended and before any starts (two barriers). The server holds one set of weights, so the depth is 1: a
second job queued would change them under the first. An evaluation or an extra round of dynamic sampling, which
push the weights of now, first wait for the job ahead (:meth:`AsyncRollouts.wait_idle`).

Every kind of rollout runs so: our environments, TRL's ``tools=`` / ``environment_factory=`` and agents through the
endpoint (whose generation then runs on the background thread, the caller of its round). Several processes run it
too, each its own pipeline: the background seam is built without ``sync_any`` / ``sync_max`` (no process waits for
another's rollouts; no dummy calls) and generates with a local copy's ``generate`` (no collective call under DDP),
so every collective call (gather, all-reduce) stays on the training thread, in the same order on every process.
Not here: DeepSpeed ZeRO-3 and FSDP with the copy (the unwrapped model holds a shard of the parameters), vLLM's
colocate mode (it shares the training device) and sync tools on the training thread (TRL's default for ``tools=`` /
``environment_factory=``, which needs ``concurrent_sync_tools=True`` here); the trainer refuses them with what to
pass instead (:func:`refusal`, :class:`~trl_agentic.trainers.config.AgenticConfig`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch
from transformers import PreTrainedModel, TrainerCallback

from ..rollout.generation import Generation, Generator, generation_session
from ..rollout.process_generator import ProcessGenerator
from ..rollout.seam import RolloutSeam
from ..trajectory import Trajectory


class GenerationStopped(Exception):
    """The background generator was asked to stop (training ended): its job's samples are discarded."""


class StoppableGenerator:
    """A generator that raises :class:`GenerationStopped` at its next call once ``stop`` is set, so that a job ahead
    ends within one generation call."""

    def __init__(self, inner: Generator, stop: threading.Event) -> None:
        self.inner = inner
        self.stop = stop

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str],
                 eos_token_ids: Sequence[int]) -> list[Generation]:
        if self.stop.is_set():
            raise GenerationStopped("training ended: the rollouts ahead are discarded")
        return self.inner.generate(prompts, max_new_tokens, stop_strings, eos_token_ids)

    def session(self) -> ContextManager[None]:
        """The inner generator's session (its KV cache across the turns of one rollout)."""
        return generation_session(self.inner)


def trained_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s parameters that train (``requires_grad``; the frozen ones never change), by name."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached clones of ``model``'s trained parameters: the weights of now, kept for a job that starts after
    training has moved the policy on."""
    return {name: param.detach().clone() for name, param in trained_parameters(model).items()}


class PolicyCopy:
    """A copy of the policy for the background generator, and the version of its weights.

    Args:
        model: The policy, unwrapped (a transformers model, or a PEFT model: its adapters are copied too).
        device: Where the copy's tensors are made (``None``: where the policy's are). Each tensor is copied there
            directly, so that a copy on the CPU of a policy on an accelerator never holds a second copy on it.

    Attributes:
        model: The copy (no gradients, eval mode).
        version: The global step whose weights it holds (-1 before the first :meth:`load`).
    """

    def __init__(self, model: torch.nn.Module, device: str | torch.device | None = None) -> None:
        memo: dict[int, Any] = {}
        if device is not None:  # deepcopy takes each tensor's copy from here: made on ``device``, tied ones shared
            memo.update({id(p): torch.nn.Parameter(p.detach().to(device, copy=True), requires_grad=False)
                         for p in model.parameters()})
            memo.update({id(b): b.detach().to(device, copy=True) for b in model.buffers()})
        self.model = copy.deepcopy(model, memo)
        self.model.requires_grad_(False)
        self.model.eval()
        for module in self.model.modules():  # the copy never trains: no hook making the embeddings' output need
            if isinstance(module, PreTrainedModel):  # gradients (PEFT with gradient checkpointing; a local
                module.disable_input_require_grads()  # function, which could not reach a generator process either)
        self.version = -1

    def load(self, weights: torch.nn.Module | Mapping[str, torch.Tensor], version: int) -> None:
        """Copy the trained parameters of ``weights`` (the policy, or a :func:`snapshot` of it) into the copy, in
        place. Call it only while the generator is idle."""
        source = trained_parameters(weights) if isinstance(weights, torch.nn.Module) else weights
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, param in source.items():
                own[name].copy_(param.detach())
        self.version = version


class CopyWeights:
    """How a job's weights reach the policy's copy (:class:`PolicyCopy`): a :func:`snapshot` of the trained
    parameters taken when the job is queued (training thread), loaded into the copy when the job starts (background
    thread: the jobs before it have ended, so nothing generates then). Any depth."""

    def __init__(self, policy: PolicyCopy) -> None:
        self.policy = policy

    def queue(self, model: torch.nn.Module, version: int) -> Callable[[], None]:
        """On the training thread, when a job is queued: what the job runs first when it starts."""
        weights = snapshot(model)
        return lambda: self.policy.load(weights, version)


class ServerWeights:
    """How a job's weights reach vLLM's server (``vllm_mode="server"``), which holds one set: ``push(version)`` on the
    training thread when the job is queued (the trainer's ``push_vllm_weights``: every process's job ahead ended, then
    TRL's ``sync_weights`` between two barriers, so that no process's job generates while the weights change and none
    starts before they are there); nothing to load when the job starts. Depth 1 only: a second job queued would
    change the weights under the first."""

    def __init__(self, push: Callable[[int], None]) -> None:
        self.push = push

    def queue(self, model: torch.nn.Module, version: int) -> Callable[[], None]:
        self.push(version)
        return lambda: None


@dataclass
class Job:
    """Rollouts of ``rows`` started on the background thread by the copy at ``version``."""

    rows: list[dict[str, Any]]
    version: int
    future: concurrent.futures.Future


@dataclass
class Rollouts:
    """What a round trains on, as a rollout source hands it over.

    Attributes:
        rows: The dataset rows rolled out (a pipeline's: those of an earlier round).
        runs: One run per row.
        environments: TRL's ``trainer.environments`` of the runs (``None`` without ``environment_factory``).
        version: The global step whose weights sampled the runs.
        behaviour: Whether the runs' ``logprobs`` are the behaviour policy's, against which the trainer corrects
            (:meth:`~trl_agentic.trainers.base.AgenticTrainer.add_logps`); ``False``: sampled by the policy of now.
        metrics: The source's metrics of the round (``async/*``), logged with it.
    """

    rows: list[dict[str, Any]]
    runs: list[Trajectory]
    environments: list[Any] | None
    version: int
    behaviour: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


class SyncSource:
    """Depth 0: each round's rows rolled out now through ``seam`` (the trainer's generator), after ``before(version)``
    when given (vLLM's weights brought up to date). Nothing runs ahead; nothing to check or stop.

    Args:
        seam: The trainer's rollout seam.
        before: Called with the round's version before it rolls out (the trainer's ``push_vllm_weights``), or
            ``None``.
        behaviour: Whether the seam's generator returns behaviour log-probs to correct against (the trainer's own
            rounds under a pipeline: :attr:`AsyncRollouts.present`).
    """

    off_policy = False

    def __init__(self, seam: RolloutSeam, before: Callable[[int], None] | None = None,
                 behaviour: bool = False) -> None:
        self.seam, self.before, self.behaviour = seam, before, behaviour

    def rollouts(self, rows: list[dict[str, Any]], model: torch.nn.Module, version: int,
                 ahead: bool = True) -> Rollouts:
        """``rows`` rolled out now, with the weights of ``version`` (``model`` and ``ahead``: unused at depth 0)."""
        if self.before is not None:
            self.before(version)
        runs, environments = self.seam.run(rows)
        return Rollouts(rows, runs, environments, version, self.behaviour)

    def callbacks(self) -> list[TrainerCallback]:
        """Nothing runs ahead: no callback."""
        return []

    def push_weights(self, push: Callable[[], None]) -> None:
        """Run ``push`` (vLLM's weights change): nothing generates meanwhile."""
        push()

    def check(self) -> None:
        """Nothing runs ahead: nothing to raise."""

    def stop(self) -> None:
        """Nothing runs ahead: nothing to stop."""


class BackgroundThread:
    """One daemon thread that runs jobs in order, each result or exception in a future (the exception keeps the
    thread's traceback). Optionally pinned to one CPU core (``os.sched_setaffinity`` on the calling thread, Linux)."""

    def __init__(self, cpu: int | None = None, name: str = "trl-agentic-rollouts") -> None:
        self.cpu = cpu
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((future, fn))
        return future

    def close(self) -> None:
        """End the thread after the jobs queued before."""
        self.jobs.put(None)

    def _serve(self) -> None:
        if self.cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {self.cpu})  # 0: this thread (Linux pins threads one by one)
        while (item := self.jobs.get()) is not None:
            future, fn = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the trainer, which raises it
                future.set_exception(exc)
            del item, future, fn  # nothing of a finished job stays alive while the thread waits for the next


class AsyncRollouts:
    """The pipeline of the module docstring.

    Args:
        seam: The rollout seam over the background generator (wrapped in a :class:`StoppableGenerator` over
            ``stop``): the policy copy's, or vLLM's server.
        weights: How a job's weights reach that generator: :class:`CopyWeights` or :class:`ServerWeights`.
        stop: The event the seam's generator checks before each call.
        depth: ``max_staleness``: the jobs kept ahead of training.
        cpu: The core the background thread is pinned to (``None``: not pinned).
        generator_process: With ``async_generator="process"``, the seam's generator's process: ended whenever the
            pipeline stops (a call in flight then ends at once; none starts another until the next job) and started
            again by the next job's first call.
        present: The trainer's own rollouts of now (evaluation, dynamic sampling's extra rounds:
            :meth:`now`), a :class:`SyncSource` over the trainer's seam whose generator returns behaviour log-probs.
        barrier: Waits for every training process (accelerate's ``wait_for_everyone``), around a push of vLLM's
            weights (:meth:`push_weights`).

    Attributes:
        ahead: The jobs started ahead of training, oldest first (``depth`` of them between rounds).
        started, produced, consumed, discarded: Samples (runs) whose rollout was started, that a job returned, that
            a round trained on, that were dropped when training ended or a round raised. ``started == consumed +
            discarded`` once nothing is ahead.
    """

    off_policy = True

    def __init__(self, seam: RolloutSeam, weights: CopyWeights | ServerWeights, stop: threading.Event,
                 depth: int = 1, cpu: int | None = None, generator_process: ProcessGenerator | None = None,
                 present: SyncSource | None = None, barrier: Callable[[], None] = lambda: None) -> None:
        self.seam = seam
        self.present = present
        self.barrier = barrier
        self.weights = weights
        self.stop_event = stop
        self.depth = depth
        self.generator_process = generator_process
        self.thread = BackgroundThread(cpu)
        self.ahead: collections.deque[Job] = collections.deque()
        self.started = self.produced = self.consumed = self.discarded = 0
        self._lock = threading.Lock()
        self._stopping: concurrent.futures.Future | None = None  # a job told to stop that may still run

    def next(self, rows: list[dict[str, Any]], model: torch.nn.Module, version: int) -> Rollouts:
        """Steps 1-3 of the pipeline: the rollouts to train on now (the oldest job's; the first round's own, its
        rows started ``depth`` times more to fill the pipeline), with ``rows``' rollouts started ahead with
        ``model``'s weights at ``version``. A failed job raises its exception here; nothing is left ahead then."""
        if not self.ahead:
            self.ahead.extend(self._start(rows, model, version) for _ in range(self.depth))
        current = self.ahead.popleft()
        try:
            runs, environments = current.future.result()
        except BaseException:
            self._discard([current, *self.ahead])  # interrupted while waiting (Ctrl-C): stopped at its next call
            self.ahead.clear()
            raise
        self.ahead.append(self._start(rows, model, version))
        self.consumed += len(runs)
        for run in runs:
            run.policy_version = current.version
        rollouts = Rollouts(current.rows, runs, environments, current.version, behaviour=True)
        rollouts.metrics = self.metrics(rollouts, version)
        return rollouts

    def rollouts(self, rows: list[dict[str, Any]], model: torch.nn.Module, version: int,
                 ahead: bool = True) -> Rollouts:
        """A training round's rollouts (``ahead``: :meth:`next`), or ``rows`` rolled out now by the trainer's own
        generator (:attr:`present`: an evaluation, dynamic sampling's extra rounds), the jobs ahead kept."""
        if ahead:
            return self.next(rows, model, version)
        return self.present.rollouts(rows, model, version)

    def callbacks(self) -> list[TrainerCallback]:
        """:class:`SourceCallback`: failures raised after each optimizer step, the jobs stopped when training ends."""
        return [SourceCallback(self)]

    def push_weights(self, push: Callable[[], None]) -> None:
        """Run ``push`` (vLLM's server's one set of weights changes) where no job of any process generates: every
        process waits for its jobs ahead to end and for the others (a barrier), pushes, and waits for every push
        to end (a second barrier) before any process queues a job of the new version."""
        self.wait_idle()
        self.barrier()
        push()
        self.barrier()

    def check(self) -> None:
        """:meth:`raise_failure`: after every optimizer step."""
        self.raise_failure()

    def stop(self) -> None:
        """Stop every job ahead (the one running at its next generation call) and count their samples discarded
        (training ended, or a round raised). The pipeline starts again at the next :meth:`next`."""
        jobs = list(self.ahead)
        self.ahead.clear()
        self._discard(jobs)
        try:
            self._end_process()
            self._wait_stopped()
        finally:
            self.stop_event.clear()

    def raise_failure(self) -> None:
        """Raise the exception of the first job ahead that has already failed (checked after every optimizer step,
        so that a failure surfaces before the round that waits for it); nothing is left ahead then."""
        failed = [job for job in self.ahead if job.future.done() and job.future.exception() is not None]
        if failed:
            self.stop()
            raise failed[0].future.exception()

    def wait_idle(self) -> None:
        """Wait until no job ahead runs or waits to run (their results are kept for their rounds): before vLLM's
        weights change outside the pipeline (an evaluation, dynamic sampling's extra round)."""
        concurrent.futures.wait([job.future for job in self.ahead])

    def close(self) -> None:
        """:meth:`stop`, and end the background thread."""
        self.stop()
        self.thread.close()

    def _discard(self, jobs: list[Job]) -> None:
        """Count ``jobs``' samples discarded and stop them: a job queued never starts, the one running (if any) is
        stopped at its next generation call and waited for by the next :meth:`stop` or start."""
        if not jobs:
            return
        self.stop_event.set()
        for job in jobs:
            self.discarded += len(job.rows)
            if not job.future.cancel() and not job.future.done():  # running: one at a time on the thread
                self._stopping = job.future

    def _wait_stopped(self) -> None:
        """Wait for the job told to stop, if any (its next generation call ends it). Its exception is not raised
        here: raised, it would link this thread's frames, and their locals (the training loop's model), to the
        traceback its future keeps."""
        if self._stopping is not None:
            concurrent.futures.wait([self._stopping])
            self._stopping = None

    def _end_process(self) -> None:
        """End the generator's process, if there is one (no child outlives the pipeline's stop)."""
        if self.generator_process is not None:
            self.generator_process.close()

    def metrics(self, rollouts: Rollouts, step: int) -> dict[str, float]:
        """``async/staleness`` (optimizer steps between the weights that sampled the round and those it trains) and
        the pipeline's counts so far."""
        return {"async/staleness": float(step - rollouts.version), "async/samples_started": float(self.started),
                "async/samples_produced": float(self.produced), "async/samples_consumed": float(self.consumed),
                "async/samples_discarded": float(self.discarded)}

    def _start(self, rows: list[dict[str, Any]], model: torch.nn.Module, version: int) -> Job:
        """Submit ``rows``' rollouts with ``model``'s weights at ``version`` (:attr:`weights`: a snapshot loaded into
        the copy when the job starts on the background thread, where jobs run one after another; or pushed to vLLM's
        server now)."""
        if self.stop_event.is_set():  # the first job after a discard: the job told to stop ends at its next call
            self._wait_stopped()
            self.stop_event.clear()
        if self.generator_process is not None:  # ended by the last stop: this job's first call starts it again
            self.generator_process.reopen()
        rows = [dict(row) for row in rows]
        load = self.weights.queue(model, version)
        self.started += len(rows)

        def job() -> Any:
            load()
            runs, environments = self.seam.run(rows)
            with self._lock:
                self.produced += len(runs)
            return runs, environments

        return Job(rows, version, self.thread.submit(job))


class SourceCallback(TrainerCallback):
    """After every optimizer step, raises the failure of work a rollout source runs ahead, if some failed meanwhile;
    when training ends, stops that work (its samples are discarded, never trained)."""

    def __init__(self, source: AsyncRollouts) -> None:
        self.source = source

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.source.check()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.source.stop()


def sharding_of(state: Any) -> str | None:
    """What shards the policy's parameters across processes under accelerate's ``state`` (DeepSpeed ZeRO-3, FSDP),
    where the unwrapped model holds a shard and a copy of it would not be the policy; ``None`` when none does."""
    deepspeed = getattr(state, "deepspeed_plugin", None)
    if deepspeed is not None and getattr(deepspeed, "zero_stage", 0) == 3:
        return "DeepSpeed ZeRO-3"
    if getattr(state, "fsdp_plugin", None) is not None:
        return "FSDP"
    return None


def refusal(sharding: str | None, tools_on_training_thread: bool) -> str | None:
    """Why ``max_staleness >= 1`` cannot run with these settings, naming what to pass instead; ``None`` when it can.
    ``sharding``: :func:`sharding_of` accelerate's state; ``tools_on_training_thread``: the seam runs TRL's sync
    tools on the training thread (:attr:`~trl_agentic.rollout.seam.RolloutSeam.tools_on_training_thread`). Several
    processes are not refused: nothing on the background thread makes a collective call (its seam has no
    ``sync_any`` / ``sync_max``, its generator is a local copy's ``generate``), so training's collective calls stay
    the only ones."""
    if sharding is not None:
        return (f"max_staleness >= 1 generates with a copy of the unwrapped policy, whose parameters {sharding} "
                f"shards across processes; pass max_staleness=0")
    if tools_on_training_thread:
        return ("max_staleness >= 1 rolls out on a background thread, where TRL's sync tools cannot run on the "
                "training thread (signal.alarm, thread-bound resources); pass concurrent_sync_tools=True (thread-safe "
                "tools) or max_staleness=0")
    return None


def generator_core(cpu: int | None, local_process_index: int, cores: set[int]) -> int | None:
    """The core this process's background generator is pinned to: ``generator_cpu`` plus the process's index on its
    machine, so that the processes of one machine pin theirs to cores of their own (``None``: not pinned). Refused
    before training when it is not one of the machine's ``cores`` (pinning would fail on the background thread; not
    the calling thread's affinity, which a caller may have narrowed to the training core)."""
    if cpu is None:
        return None
    core = cpu + local_process_index
    if core not in cores:
        raise ValueError(f"generator_cpu={cpu} + local process index {local_process_index} = core {core} is not a "
                         f"core of this machine ({', '.join(map(str, sorted(cores)))}): pass generator_cpu=None or a "
                         f"smaller core")
    return core
