"""Pre-started workers (:class:`Pool`): a background thread keeps ``size`` ready ones waiting, so that a session's
first call does not pay the start-up time."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from .launch import LaunchSpec
from .worker import Worker

logger = logging.getLogger(__name__)


class Pool:
    """Pre-started, ready workers; a background thread keeps ``size`` of them waiting."""

    def __init__(self, spec: LaunchSpec, size: int):
        self.spec = spec
        self.size = max(0, int(size))
        self.idle: deque[Worker] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.failures = 0
        self.thread: threading.Thread | None = None
        if self.size:
            self.thread = threading.Thread(target=self._refill, name="trl-agentic-sandbox-pool", daemon=True)
            self.thread.start()

    def spawn(self) -> Worker:
        """Start a worker and wait until it is ready (raises :class:`~.base.SandboxError` if it cannot start)."""
        worker = Worker(self.spec)
        worker.wait_ready(self.spec.startup_timeout)
        return worker

    def acquire(self) -> Worker:
        """A ready worker: an idle one when there is one, else a new one."""
        with self.cond:
            while self.idle:
                worker = self.idle.popleft()
                if worker.alive():
                    self.cond.notify_all()
                    return worker
                worker.kill()
            self.cond.notify_all()
        return self.spawn()

    def _refill(self) -> None:
        while True:
            with self.cond:
                while not self.closed and len(self.idle) >= self.size:
                    self.cond.wait()
                if self.closed:
                    return
            try:
                worker = self.spawn()
                self.failures = 0
            except Exception as exc:  # noqa: BLE001 - keep the pool thread alive; acquire() reports errors
                self.failures += 1
                logger.warning("sandbox pool could not start a worker: %s", exc)
                time.sleep(min(30.0, 0.5 * 2 ** min(self.failures, 6)))
                continue
            with self.cond:
                if self.closed:
                    worker.kill()
                    return
                self.idle.append(worker)

    def close(self) -> None:
        """Stop refilling and kill the idle workers."""
        with self.cond:
            self.closed = True
            idle, self.idle = list(self.idle), deque()
            self.cond.notify_all()
        for worker in idle:
            worker.kill()
