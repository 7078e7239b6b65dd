"""The steps of a round's runs, for GiGPO (:mod:`trl_agentic.algorithms.gigpo`): the state each step starts from and
its turn reward, read from the runs of every kind of rollout (the engine's, with our environments or TRL's; an agent
run's segments), and each step's value given back to the tokens of its turn.

A run's steps are its training rows' turns, row after row: one row for the engine's runs, an agent run's segments in
the order they started. A step's state is keyed (:func:`state_keys`) by what the environment says where it says it
(``StepInfo.state_key``, a TRL class's ``_state_key()``: the state a turn led to is the one the next turn starts
from), else by the observations (``gigpo_state_key``): ``"history"``, the exact prompt ids (the prompt and what
``reset`` returned) and the text of every observation before the turn; ``"observation"``, the last observation before
the turn alone (the prompt for the first), for environments whose observation is their whole state. Keys are kept as
digests (BLAKE2b, 128 bits), so that what is gathered across processes is small whatever the history's length.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..algorithms.turns import broadcast_turns, turn_ids_from_spans
from ..environments.base import read_info
from ..trajectory import Trajectory

STATE_KEYS = ("history", "observation")
"""How a state the environment gives no key for is keyed."""


@dataclass(frozen=True)
class RunSteps:
    """The steps of one run, in order.

    Attributes:
        keys: The digest of the key of the state each step starts from.
        rewards: Each step's turn reward (``Trajectory.turn_rewards``; 0.0 where the turn has none).
    """

    keys: tuple[str, ...]
    rewards: tuple[float, ...]


def _digest(*parts: object) -> str:
    return hashlib.blake2b(json.dumps(parts, default=str).encode(), digest_size=16).hexdigest()


def _encoded(observation: object) -> bytes:
    """An observation as bytes that tell it apart from any other, its length first (``None``: nothing appended)."""
    if observation is None:
        return b"-"
    text = observation if isinstance(observation, str) else json.dumps(observation, default=str)
    data = text.encode("utf-8", "surrogatepass")
    return len(data).to_bytes(8, "little") + data


def state_keys(trajectory: Trajectory, state_key: str = "history") -> list[str]:
    """The key (a digest) of the state each turn of ``trajectory`` starts from (module docstring)."""
    if state_key not in STATE_KEYS:
        raise ValueError(f"gigpo_state_key must be one of {STATE_KEYS}, got {state_key!r}")
    prompt = _digest("prompt", trajectory.prompt_ids)
    history = hashlib.blake2b(prompt.encode(), digest_size=16)
    last = prompt
    keys = []
    for k in range(trajectory.num_turns):
        if k > 0:
            observation = trajectory.observations[k - 1] if k - 1 < len(trajectory.observations) else None
            if state_key == "history":
                history.update(_encoded(observation))
            elif observation is not None:
                last = "observation:" + hashlib.blake2b(_encoded(observation), digest_size=16).hexdigest()
        told = read_info(trajectory.turn_infos[k - 1]).state_key if 0 < k <= len(trajectory.turn_infos) else None
        if told is not None:
            keys.append(_digest("environment", told))
        else:
            keys.append("history:" + history.hexdigest() if state_key == "history" else last)
    return keys


def run_steps(run: Trajectory, state_key: str = "history") -> RunSteps:
    """The steps of ``run``: its training rows' turns, row after row."""
    keys: list[str] = []
    rewards: list[float] = []
    for row in run.training_rows():
        keys += state_keys(row, state_key)
        rewards += [float(r) for r in row.turn_rewards[: row.num_turns]] + [0.0] * (row.num_turns - len(row.turn_rewards))
    return RunSteps(tuple(keys), tuple(rewards))


def step_tensors(steps: Sequence[RunSteps]) -> tuple[list[tuple[str, ...]], torch.Tensor, torch.Tensor]:
    """The keys of every run's steps, their turn rewards (N, K) and which steps exist (N, K), K the most steps of any
    run."""
    width = max((len(s.keys) for s in steps), default=0)
    rewards = torch.zeros(len(steps), width)
    mask = torch.zeros(len(steps), width, dtype=torch.bool)
    for i, s in enumerate(steps):
        rewards[i, : len(s.rewards)] = torch.tensor(s.rewards, dtype=torch.float32)
        mask[i, : len(s.keys)] = True
    return [s.keys for s in steps], rewards, mask


def token_values(per_step: torch.Tensor, trajectories: Sequence[Trajectory], owners: Sequence[int],
                 width: int) -> torch.Tensor:
    """(B, W): each training row's tokens get the value of the step their turn is (``per_step``: this process's runs
    x K, each run's steps in :func:`run_steps`' order), 0 outside every turn's sampled span and on padding rows
    (owner -1)."""
    rows, taken = [], [0] * per_step.shape[0]  # taken: the steps of each run its earlier rows hold
    for owner, trajectory in zip(owners, trajectories):
        values = per_step.new_zeros(len(trajectory.turn_spans))
        if owner >= 0:
            mine = per_step[owner, taken[owner]: taken[owner] + trajectory.num_turns][: len(values)]
            values[: len(mine)] = mine
            taken[owner] += trajectory.num_turns
        rows.append(values)
    longest = max((len(r) for r in rows), default=0)
    turn_values = torch.stack([torch.nn.functional.pad(r, (0, longest - len(r))) for r in rows]) if rows \
        else per_step.new_zeros(0, 0)
    ids = turn_ids_from_spans([t.turn_spans for t in trajectories], torch.ones(len(trajectories), width))
    return broadcast_turns(turn_values, ids)
