"""The batching bridge: the model calls of many concurrent agents, generated together.

Requests arrive one by one on the server's thread (:meth:`GenerationBridge.submit`); generation runs on the caller's
thread (the trainer's main thread, where every other model call runs) in :meth:`GenerationBridge.serve`, one
``Generator.generate`` call per round for everything pending:

- a round starts as soon as *every* running agent has a request waiting (nothing more can come), or when no request
  has arrived for a quiet gap (a burst of requests keeps the round open), or after a longest wait since its first
  request, whichever is first; requests that arrive while a round generates go to the next. The gap is ``window``
  seconds or a tenth of the last round's generation time, whichever is longer, and the longest wait ten windows or
  half that generation time: a generation call costs a fixed time whatever its rows, so when generating is slow,
  waiting a little longer for the agents still processing the last answers is cheaper than an extra round;
- the waits of requests that arrived while a round generated count from its end: the agents it answers send their
  next requests a moment later (a tool, the request's encoding), and a round started at once would take only the
  early ones and the others a round later, every turn after (a group whose first requests came apart, as CLI
  processes starting at different times send them, would take two ``generate`` calls for each later turn);
- one call per round: ``max_new_tokens`` is the largest budget of the round and the stop strings are those every
  request of the round has; each request then keeps its own prefix (its own budget, stop strings and the end ids,
  :func:`~trl_agentic.rollout.generation.cut_at_stop`, in the session), so the kept ids are exactly the ids sampled.

Several processes: every process makes the same number of generation calls (vLLM server mode, tensor-parallel
colocate and ZeRO-3 need it, as for the engine): rounds continue while *any* process has a running agent
(``sync_any``), and a process with nothing pending in a round generates a one-token dummy. With one process no dummy
is ever generated.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..rollout.generation import Generation, Generator

MAX_WAIT_WINDOWS = 10
"""A round waits at most this many windows after its first request (or half the last generation time)."""
GAP_SHARE, MAX_WAIT_SHARE = 0.1, 0.5
"""The quiet gap and the longest wait, as shares of the last round's generation time, when that is longer."""


@dataclass
class Pending:
    """One model call waiting for its round."""

    key: str
    prompt_ids: list[int]
    max_new_tokens: int
    stop: list[str]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class GenerationBridge:
    """See the module docstring.

    Args:
        generator: The generation seam.
        eos_token_ids: Every id that ends a turn.
        window: Seconds without a new request after which a round starts.
        sync_any: Given whether this process still has work, whether any process has (identity on one process).
        multi_process: Whether ``sync_any`` spans several processes (then rounds are paced by ``window`` and empty
            rounds generate a dummy).
    """

    def __init__(self, generator: Generator, eos_token_ids: Sequence[int], window: float,
                 sync_any: Callable[[bool], bool] | None = None, multi_process: bool = False) -> None:
        self.generator = generator
        self.eos_token_ids = list(eos_token_ids)
        self.window = window
        self.sync_any = sync_any or (lambda local: local)
        self.multi_process = multi_process
        self._pending: list[Pending] = []
        self._running: set[str] = set()
        self._first_at: float | None = None
        self._last_at = 0.0
        self._last_generation = 0.0
        self._cond = threading.Condition()

    # -- server side -----------------------------------------------------------------------------------------
    def submit(self, key: str, prompt_ids: list[int], max_new_tokens: int,
               stop: list[str]) -> concurrent.futures.Future:
        """Queue one model call of the agent ``key``; the future resolves to its :class:`Generation` (uncut)."""
        item = Pending(key, list(prompt_ids), max_new_tokens, list(stop))
        with self._cond:
            if key not in self._running:
                item.future.cancel()
                return item.future
            self._last_at = time.monotonic()
            if not self._pending:
                self._first_at = self._last_at
            self._pending.append(item)
            self._cond.notify_all()
        return item.future

    # -- agents' side ----------------------------------------------------------------------------------------
    def start(self, keys: Sequence[str]) -> None:
        """A rollout begins: these agents are running."""
        with self._cond:
            self._running = set(keys)
            self._pending.clear()  # the last generation time is kept: the next rollout's first round uses it

    def add(self, key: str) -> None:
        """One more agent runs in this rollout (a run started again, with a fresh key)."""
        with self._cond:
            self._running.add(key)
            self._cond.notify_all()

    def finished(self, key: str) -> None:
        """An agent returned, failed or timed out: its waiting calls are dropped."""
        with self._cond:
            self._running.discard(key)
            kept = []
            for item in self._pending:
                (kept.append(item) if item.key != key else item.future.cancel())
            self._pending = kept
            self._cond.notify_all()

    # -- the generation loop ---------------------------------------------------------------------------------
    def serve(self) -> None:
        """Generate rounds until no agent of any process is running (call on the thread that owns the model)."""
        while True:
            batch = self._take()
            if not self.sync_any(bool(batch) or self.running()):
                return
            if not batch:
                if self.multi_process:
                    self.generator.generate([[self.eos_token_ids[0]]], 1, [], self.eos_token_ids)
                continue
            self._generate(batch)

    def running(self) -> bool:
        with self._cond:
            return bool(self._running)

    def _ready(self) -> bool:
        if not self._pending:
            return False
        waiting = {item.key for item in self._pending}
        return self._running <= waiting or time.monotonic() >= self._round_deadline()

    def _round_deadline(self) -> float:
        gap = max(self.window, GAP_SHARE * self._last_generation)
        longest = max(MAX_WAIT_WINDOWS * self.window, MAX_WAIT_SHARE * self._last_generation)
        return min(self._last_at + gap, self._first_at + longest)

    def _take(self) -> list[Pending]:
        """The next round: wait until it is ready (or, with several processes, at most ``window``)."""
        deadline = time.monotonic() + self.window if self.multi_process else None
        with self._cond:
            while self._running and not self._ready():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                waits = [t for t in (deadline, self._round_deadline() if self._pending else None) if t]
                self._cond.wait(timeout=max(0.0, min(waits) - now) if waits else None)
            batch, self._pending = self._pending, []
            return batch

    def _generate(self, batch: list[Pending]) -> None:
        common = [s for s in batch[0].stop if all(s in item.stop for item in batch[1:])]
        started = time.perf_counter()
        try:
            outputs = self.generator.generate([item.prompt_ids for item in batch],
                                              max(item.max_new_tokens for item in batch), common, self.eos_token_ids)
        except BaseException as exc:
            for item in batch:
                if item.future.set_running_or_notify_cancel():
                    item.future.set_exception(exc)
            raise
        self._last_generation = time.perf_counter() - started
        with self._cond:
            if self._pending:  # they waited for the generator, not for the agents this round answers
                self._first_at = self._last_at = time.monotonic()
        for item, output in zip(batch, outputs):
            if item.future.set_running_or_notify_cancel():  # False: its agent ended meanwhile
                item.future.set_result(Generation(list(output.ids), output.logprobs))
