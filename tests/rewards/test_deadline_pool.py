"""The deadline pool: a call returns its function's value, a call past its deadline kills its worker, and a dead
worker is replaced; callable from any thread."""

from __future__ import annotations

import threading
import time

import pytest

from trl_agentic.rewards.verifiers.deadline import DeadlineExceeded, DeadlinePool, WorkerFailed


@pytest.fixture
def pool():
    pool = DeadlinePool("time:sleep", max_workers=2, memory_mb=0)
    yield pool
    pool.close()


def test_value_and_reuse():
    pool = DeadlinePool("math:hypot", max_workers=1)
    try:
        assert pool.call(3, 4, timeout=30) == 5.0
        process = pool._idle[0]
        assert pool.call(5, 12, timeout=5) == 13.0
        assert pool._idle == [process]  # the same worker served both calls
        with pytest.raises(RuntimeError, match="TypeError"):
            pool.call("x", timeout=5)
        assert pool.call(6, 8, timeout=5) == 10.0
    finally:
        pool.close()


def test_deadline_kills_the_worker_and_the_next_call_gets_a_new_one(pool):
    assert pool.call(0, timeout=30) is None  # started and warm
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        pool.call(60, timeout=0.5)
    assert time.monotonic() - start < 5
    assert pool._count == 0 and not pool._idle
    assert pool.call(0, timeout=30) is None


def test_deadline_holds_off_the_main_thread(pool):
    pool.call(0, timeout=30)
    box = []

    def run():
        try:
            pool.call(60, timeout=0.5)
        except DeadlineExceeded as exc:
            box.append(exc)

    thread = threading.Thread(target=run)
    start = time.monotonic()
    thread.start()
    thread.join(10)
    assert box and time.monotonic() - start < 5


def test_a_worker_that_dies_is_reported_and_replaced():
    pool = DeadlinePool("os:_exit", max_workers=1, memory_mb=0)
    try:
        with pytest.raises(WorkerFailed):
            pool.call(3, timeout=30)
        assert pool._count == 0
    finally:
        pool.close()


def test_concurrent_calls_share_at_most_max_workers(pool):
    results = []
    threads = [threading.Thread(target=lambda: results.append(pool.call(0.2, timeout=30))) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [None] * 5 and pool._count <= 2
