"""The keys the integrations give GiGPO for a state reported as data (trl_agentic.integrations.state_keys): equal
exactly when the data is, in any process; and OpenEnvEnvironment's per-turn rewards and keys over a client's results
(trl_agentic.integrations.openenv_environment). Neither imports an ecosystem's package: these run in every venv."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from trl_agentic.integrations.openenv_environment import OpenEnvEnvironment
from trl_agentic.integrations.state_keys import state_key

ROOT = Path(__file__).resolve().parents[2]
BOARD = "from trl_agentic.integrations.state_keys import state_key; print(state_key({'seen': {'alpha', 'beta', " \
        "'gamma', 'delta'}, 'turn': 3})); print(list({'alpha', 'beta', 'gamma', 'delta'}))"


def test_a_set_of_strings_has_one_key_in_every_process():
    """A set of strings iterates in an order that Python's hash seed decides, which differs between processes (the
    ranks of a run): its key does not."""
    lines = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", BOARD], capture_output=True, text=True, env=env, timeout=120,
                              check=True)
        lines.append(proc.stdout.splitlines())
    assert len({order for _, order in lines}) > 1  # the sets iterated in different orders
    assert {key for key, _ in lines} == {'{"seen":set["alpha","beta","delta","gamma"],"turn":3}'}


class Colour(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Cell:
    row: int
    col: int


class Car:
    """As TextArena's RushHour cars: __slots__, no __dict__, a repr that is its address."""

    __slots__ = ("vid", "row")

    def __init__(self, vid: str, row: int) -> None:
        self.vid, self.row = vid, row


class Token:
    def __init__(self, name: str) -> None:
        self.name = name


def test_equal_data_has_equal_keys_and_different_data_different_keys():
    assert state_key({"b": [1, (2, 3)], "a": None}) == state_key({"a": None, "b": [1, [2, 3]]})
    assert state_key({1: "x"}) != state_key({"1": "x"})  # TextArena's player ids are ints
    assert state_key([True]) != state_key([1]) and state_key([1]) != state_key([1.0])
    assert state_key(Car("A", 0)) == state_key(Car("A", 0)) != state_key(Car("A", 1))
    assert "0x" not in state_key({"cars": [Car("A", 0)]}) and "0x" not in state_key(Token("t"))
    assert state_key(Token("t")) == state_key(Token("t")) != state_key(Token("u"))
    assert state_key(Cell(1, 2)) == 'Cell{"col":2,"row":1}'
    assert state_key([Colour.RED, b"\x00\x01", frozenset({2, 1})]) == '[Colour.RED,bytes:0001,set[1,2]]'
    assert state_key({"a": 1}) == json.dumps({"a": 1}, separators=(",", ":"))  # plain data reads as JSON


def test_what_has_no_stable_text_gets_no_key():
    """A function, a bare object, an object graph with a cycle: no key (the turn is keyed by the observation history),
    never a key that differs for equal states or one shared by different states."""
    looped: list = []
    looped.append(looped)
    assert state_key({"f": print}) is None
    assert state_key(lambda: 0) is None
    assert state_key([object()]) is None
    assert state_key(looped) is None
    assert state_key(Token) is None


class FakeClient:
    """An OpenEnv client's sync interface: reset and step return a StepResult (observation, reward, done)."""

    def __init__(self) -> None:
        self.position = 0

    def reset(self, **kwargs):
        self.position = 0
        return self._result(None)

    def step(self, action: int):
        self.position += action
        return self._result(0.5 * action if action else None)

    def _result(self, reward):
        observation = SimpleNamespace(model_dump=lambda: {"position": self.position, "reward": reward, "done": False,
                                                          "metadata": {}})
        return SimpleNamespace(observation=observation, reward=reward, done=False)


class Walk(OpenEnvEnvironment):
    def __init__(self) -> None:
        self.client = FakeClient()

    def reset(self, **kwargs) -> str:
        return str(self._reset(**kwargs).observation.model_dump()["position"])

    def move(self, steps: int) -> str:
        """Move.

        Args:
            steps: How far.
        """
        return str(self._step(steps).observation.model_dump()["position"])


def test_openenv_environment_gives_each_turn_its_steps_reward_and_its_observations_key():
    """A turn's reward is its steps' (tool calls') rewards summed, 0 for a turn without one (a step's None reward is
    0); the key is the last observation's fields but its reward; episode_reward sums the episode, and a reset starts
    both over."""
    walk = Walk()
    assert walk._state_key() is None  # before any reset
    walk.reset()
    assert walk._turn_reward() == 0.0 and json.loads(walk._state_key()) == {"done": False, "metadata": {},
                                                                            "position": 0}
    walk.move(1), walk.move(2)  # one turn, two calls
    assert walk._turn_reward() == 1.5 and walk._turn_reward() == 0.0  # the next turn called nothing
    reached_one_way = walk._state_key()
    walk.move(0)  # reward None
    assert walk._turn_reward() == 0.0 and walk.episode_reward == 1.5
    other = Walk()
    other.reset()
    other.move(3)  # the same place in one step: reward 1.5 on the step, not in the key
    assert other._state_key() == reached_one_way == walk._state_key()
    walk.reset()
    assert walk.episode_reward == 0.0 and walk._turn_reward() == 0.0


def test_openenv_environment_adds_no_tool():
    """TRL 1.16 shows the model the public functions of the class (other than reset and get_reward), listed on the
    class: the base adds none, so the subclass's tools are its own."""
    tools = [name for name, _ in inspect.getmembers(Walk, predicate=inspect.isfunction)
             if name not in ("reset", "get_reward") and not name.startswith("_")]
    assert tools == ["move"]
