"""A generator whose forward passes run in a child process: the generation seam (:class:`~.generation.Generator`)
over an :class:`~.generation.HFGenerator` that lives in a process of its own.

Why: asynchronous rollouts (``max_staleness >= 1``) generate on a background thread while the training thread trains.
Two threads of one interpreter share the GIL, and with small models, whose ``generate`` is mostly Python, the two
take turns instead of running side by side (``docs/benchmarks.md``). Here only the rollout loop (engine, tools,
environments, the agents' endpoint) stays on the trainer's background thread; each ``generate`` call crosses a
``Pipe`` to the child, token ids in, ids and log-probs out.

- Weights: the model's parameters and buffers are moved to shared memory (``share_memory_``) before the child is
  spawned, so that the child's model reads the very memory the trainer's copy holds. Writing into them in place
  (``PolicyCopy.load`` at the start of each job, only while no call runs) is what the child sees at its next call.
  Shared memory lives in ``/dev/shm``, which must hold the model (a container's default may be 64 MB).
- The child is started with ``spawn`` (never ``fork``: the trainer has torch threads running), at the first call
  (so a generator never used costs nothing), pins itself to ``cpu`` (``os.sched_setaffinity``), runs ``threads``
  torch threads, seeds torch's generator with ``seed`` (the same calls give the same samples) and ignores Ctrl-C:
  its owner ends it (:meth:`ProcessGenerator.close`). It ends on its own when the trainer's end of the pipe closes.
- Sessions (:meth:`ProcessGenerator.session`) are forwarded: the child's ``HFGenerator`` keeps each trajectory's KV
  cache across the turns of one rollout, as in the trainer process.
- Failures: an exception in the child is raised in the caller as :class:`GeneratorProcessError`, its message ending
  with the child's traceback; a child that dies (killed, a segfault) raises :class:`GeneratorProcessDied`, one line
  naming the signal or exit code, found by polling the pipe with a timeout and checking the process is alive (never a
  hang); a call cut short by :meth:`~ProcessGenerator.close`, or made after it, raises :class:`GeneratorClosed`. After
  a death the next call starts a new child over the same shared weights; after :meth:`~ProcessGenerator.close`, the
  next call once :meth:`~ProcessGenerator.reopen` is called (so that no call in flight during a close starts one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import traceback
from typing import Any, Iterator, Sequence

import torch
import torch.multiprocessing as mp

from .generation import Generation, HFGenerator

COUNTS = ("prefilled_tokens", "reused_tokens", "shared_tokens", "peak_cached_tokens")
"""The counts of :class:`~.generation.HFGenerator` (its KV cache's work) mirrored in the trainer process."""


class GeneratorProcessError(RuntimeError):
    """An exception raised in the generator's process; the message ends with that process's traceback."""


class GeneratorProcessDied(RuntimeError):
    """The generator's process ended while a call waited for it (killed, a segfault, an exit)."""


class GeneratorClosed(RuntimeError):
    """The generator was closed while a call waited for it (training ended): the call's result is dropped."""


class ProcessGenerator:
    """:class:`~.generation.HFGenerator` in a child process (module docstring), with its log-probs.

    Args:
        model: The model to generate with (a transformers model, or a PEFT model with its adapters). Its parameters
            and buffers are moved to shared memory here, in place: write into them only while no call runs.
        processing_class: Tokenizer (or processor) for padding and stop strings.
        generation_config: Sampling settings, as :class:`~.generation.HFGenerator`'s.
        return_logprobs: Return the log-prob of each sampled token (the behaviour policy's).
        keep_cache: Inside a session, keep each row's KV cache between calls.
        max_cached_tokens: Most positions the kept cache holds (:class:`~.generation.HFGenerator`'s).
        cpu: The core the child pins itself to (Linux; ``None``: not pinned).
        threads: torch threads in the child.
        seed: torch's seed in the child, set when it starts: the same calls after a start give the same samples.
        poll_s: How often a waiting call checks that the child is alive.

    Attributes:
        prefilled_tokens, reused_tokens, shared_tokens, peak_cached_tokens: The child generator's counts (:data:`COUNTS`,
            :class:`~.generation.HFGenerator`'s) since its last start, as of the last call.
    """

    def __init__(self, model: torch.nn.Module, processing_class: Any, generation_config: Any = None,
                 return_logprobs: bool = False, keep_cache: bool = True, cpu: int | None = None, threads: int = 1,
                 seed: int = 0, poll_s: float = 0.2, max_cached_tokens: int | None = None) -> None:
        model.share_memory()
        self.model = model
        self.settings = {"processing_class": processing_class, "generation_config": generation_config,
                         "return_logprobs": return_logprobs, "keep_cache": keep_cache, "cpu": cpu,
                         "threads": threads, "seed": seed, "max_cached_tokens": max_cached_tokens}
        self.poll_s = poll_s
        self._set_counts((0,) * len(COUNTS))
        self.process: Any = None  # multiprocessing's SpawnProcess, or None before the first call and after close
        self._conn: Any = None
        self._calls = threading.Lock()  # one request at a time on the pipe
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The child's process id (``None`` when none runs)."""
        return self.process.pid if self.process is not None else None

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str],
                 eos_token_ids: Sequence[int]) -> list[Generation]:
        rows = self._call("generate", ([list(p) for p in prompts], max_new_tokens, list(stop_strings),
                                       list(eos_token_ids)))
        return [Generation(ids=ids, logprobs=logprobs) for ids, logprobs in rows]

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The child generator's session: the calls inside share a KV cache (one rollout, whose weights do not
        change), dropped on exit."""
        self._call("begin", None)
        try:
            yield
        finally:
            process = self.process
            if process is not None and process.is_alive():  # a dead or closed child has no session left to end
                self._call("end", None)

    def close(self) -> None:
        """End the child now; a call waiting for it, and every call until :meth:`reopen`, raises
        :class:`GeneratorClosed`. Safe from another thread than the caller's."""
        self._closed = True  # first: a call starting a child now sees it and ends that child itself
        process, conn = self.process, self._conn
        self.process = self._conn = None
        if process is None:
            return
        process.terminate()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
        conn.close()

    def reopen(self) -> None:
        """Let calls start a child again after :meth:`close`."""
        self._closed = False

    def _start(self) -> tuple[Any, Any]:
        process, conn = self.process, self._conn
        if self._closed:
            raise GeneratorClosed("the generator process was closed")
        if process is None or not process.is_alive():
            if process is not None:  # a dead child: its pipe
                conn.close()
            context = mp.get_context("spawn")
            conn, child = context.Pipe()
            process = context.Process(target=serve, args=(child, self.model, self.settings),
                                      name="trl-agentic-generator", daemon=True)
            process.start()
            child.close()
            self.process, self._conn = process, conn
            self._set_counts((0,) * len(COUNTS))
            if self._closed:  # closed meanwhile, before close() could see this child
                self.close()
                raise GeneratorClosed("the generator process was closed")
        return process, conn

    def _call(self, kind: str, payload: Any) -> Any:
        with self._calls:
            process, conn = self._start()
            try:
                conn.send((kind, payload))
                while not conn.poll(self.poll_s):  # a reply, or the end of the pipe
                    if not process.is_alive():  # dead without either: a process it started holds its end open
                        raise EOFError
                reply = conn.recv()
            except (EOFError, OSError):
                if process is not self.process:
                    raise GeneratorClosed("the generator process was closed during the call") from None
                process.join(1)
                raise GeneratorProcessDied(_death(process)) from None
        status, *rest = reply
        if status == "error":
            message, child_traceback = rest
            raise GeneratorProcessError(f"{message}\n--- the generator process's traceback ---\n{child_traceback}")
        value, counts = rest
        self._set_counts(counts)
        return value

    def _set_counts(self, counts: Sequence[int]) -> None:
        for name, count in zip(COUNTS, counts):
            setattr(self, name, count)


def _death(process: Any) -> str:
    """One line: which child died and how."""
    code = process.exitcode
    if code is not None and code < 0:
        how = f"killed by signal {signal.Signals(-code).name}"
    elif code is not None:
        how = f"exited with code {code}"
    else:
        how = "closed its pipe"
    return f"the generator process (pid {process.pid}) died during a call: {how}"


def serve(conn: Any, model: torch.nn.Module, settings: dict[str, Any]) -> None:
    """The child's loop: answer each request (``generate``, ``begin``, ``end`` of a session) with ``("ok", value,
    counts)`` (the generator's :data:`COUNTS`) or ``("error", message, traceback)``, until the trainer's end of the
    pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the trainer ends us
    if settings["cpu"] is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {settings["cpu"]})
    torch.set_num_threads(settings["threads"])
    torch.manual_seed(settings["seed"])
    generator = HFGenerator(model, settings["processing_class"], settings["generation_config"],
                            return_logprobs=settings["return_logprobs"], keep_cache=settings["keep_cache"],
                            max_cached_tokens=settings["max_cached_tokens"])
    sessions: list[Any] = []  # the sessions begun and not ended, innermost last
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):  # the trainer is gone
            return
        try:
            if kind == "generate":
                value: Any = [(g.ids, g.logprobs) for g in generator.generate(*payload)]
            elif kind == "begin":
                sessions.append(generator.session())
                sessions[-1].__enter__()
                value = None
            elif kind == "end":
                if sessions:  # none when the session began in a child before this one
                    sessions.pop().__exit__(None, None, None)
                value = None
            else:
                raise ValueError(f"unknown request {kind!r}")
            reply: tuple = ("ok", value, tuple(getattr(generator, name) for name in COUNTS))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller, which raises it
            reply = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
