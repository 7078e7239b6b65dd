"""How the bridge groups concurrent agents' model calls into ``generate`` calls (trl_agentic/agents/bridge.py)."""

from __future__ import annotations

import threading
import time

from trl_agentic.agents.bridge import GenerationBridge
from trl_agentic.rollout.generation import Generation


class SlowGenerator:
    """Answers every prompt with one id after ``seconds``; records each call's rows, and runs ``during`` (once)
    while the first call generates."""

    def __init__(self, seconds: float, during) -> None:
        self.seconds, self.during, self.sizes = seconds, during, []

    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        self.sizes.append(len(prompts))
        if self.during is not None:
            self.during, during = None, self.during
            during()
        time.sleep(self.seconds)
        return [Generation([7]) for _ in prompts]


def test_a_request_that_arrives_while_a_round_generates_waits_for_the_others_answered_by_it():
    """Three agents' first calls form a round; while it generates, the fastest agent's next call arrives. The other
    two send theirs just after the round's answers: they join it in one round, not a round of one followed by a
    round of two (a group of agents would then take two ``generate`` calls for every later turn)."""
    bridge = GenerationBridge(generator=None, eos_token_ids=[0], window=0.2)
    bridge.start(["a", "b", "c"])
    second = []
    generator = SlowGenerator(0.5, lambda: second.append(bridge.submit("a", [1, 2], 4, [])))  # past the quiet gap
    bridge.generator = generator
    first = [bridge.submit(key, [1], 4, []) for key in ("a", "b", "c")]

    def agents():
        for key, future in zip(("b", "c"), first[1:]):
            future.result()
            second.append(bridge.submit(key, [1, 2], 4, []))
        for future in second:
            future.result()
        for key in ("a", "b", "c"):
            bridge.finished(key)

    thread = threading.Thread(target=agents)
    thread.start()
    bridge.serve()
    thread.join()
    assert generator.sizes == [3, 3]
