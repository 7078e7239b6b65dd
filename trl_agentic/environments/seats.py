"""The protocol of an environment with several seats: a game of two or more players (TicTacToe, Kuhn Poker, a
negotiation), or a conversation between an assistant and a simulated user.

One instance is one game. At each point one seat is to act: :meth:`SeatedEnvironment.reset` and
:meth:`SeatedEnvironment.step` both answer with a :class:`SeatTurn` saying whose turn it is now and what that seat
sees before it acts (what is new to it since its own last turn: the other seats' moves, the game's messages), and
the rewards the last move gave, per seat. Who plays each seat (the policy being trained, a frozen copy of it, another
model, a scripted player) and which seats train is not the game's business: :class:`~trl_agentic.rollout.seats.Seats`
says it, and :mod:`trl_agentic.rollout.seats` plays the games, one trajectory per trained seat, each with its own
context (its own observations, its own moves).

Each method may be a plain or an ``async`` method, as :class:`~trl_agentic.Environment`'s; every call runs under
``env_timeout`` and what it returns is checked (:func:`check_seat_turn`): a game that raises, hangs or returns
anything else ends its own trajectories (``env_error`` / ``env_timeout``), named in one line.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import EnvironmentOutputError, read_info


@dataclass
class SeatTurn:
    """Where a game stands after a reset or a move.

    Attributes:
        seat: The seat to act now; ``None`` when the game is over.
        observation: What that seat sees before it acts: the text new to it since its own last turn (the whole
            opening at its first turn), appended to its context as untrusted text; ``None`` appends nothing.
        rewards: The rewards the move just played gave, per seat (a zero-sum game: ``{"Player 0": 1.0,
            "Player 1": -1.0}`` when it ends); each is added to that seat's last turn (``Trajectory.turn_rewards``).
            A game over (``seat=None``) ends every seat's trajectory ``terminated``; a game cut short without an
            outcome gives no rewards (a draw: 0 each).
        info: Details of the move just played, kept as the mover's ``Trajectory.turn_infos`` entry (the keys the
            library reads: :class:`~trl_agentic.environments.base.StepInfo`).
    """

    seat: str | None
    observation: str | None = None
    rewards: Mapping[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class SeatedEnvironment:
    """Base class of environments with several seats (optional: any object with ``seats``, ``reset`` and ``step``
    is accepted).

    Attributes:
        seats: The seats' names, in the game's order (``("Player 0", "Player 1")``).
        stop_strings: Strings after which generation stops within a turn, as :class:`~trl_agentic.Environment`'s.
    """

    seats: Sequence[str] = ()
    stop_strings: Sequence[str] = ()

    def reset(self, **row: Any) -> SeatTurn:
        """Start a game for one dataset row (all its columns as keyword arguments); who opens, and what it sees."""
        raise NotImplementedError

    def step(self, action: str) -> SeatTurn:
        """Play the text the seat whose turn it was produced; who acts next, what it sees, the move's rewards."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the game holds; called once when the game ends, also after an error."""


def check_seat_turn(result: Any, where: str) -> SeatTurn:
    """``result`` if it is a well-typed :class:`SeatTurn`; else an :class:`~trl_agentic.environments.base.
    EnvironmentOutputError` naming ``where``, the field and the type, in one line."""
    if not isinstance(result, SeatTurn):
        raise EnvironmentOutputError(f"{where} must return a SeatTurn(seat, observation, rewards), got "
                                     f"{type(result).__name__}")
    if result.seat is not None and not isinstance(result.seat, str):
        raise EnvironmentOutputError(f"{where}: SeatTurn.seat must be a seat's name (str) or None, got "
                                     f"{type(result.seat).__name__}")
    if result.observation is not None and not isinstance(result.observation, str):
        raise EnvironmentOutputError(f"{where}: SeatTurn.observation must be text or None, got "
                                     f"{type(result.observation).__name__}")
    if not isinstance(result.rewards, Mapping):
        raise EnvironmentOutputError(f"{where}: SeatTurn.rewards must map seats to numbers, got "
                                     f"{type(result.rewards).__name__}")
    for seat, reward in result.rewards.items():
        if not isinstance(reward, numbers.Real) or isinstance(reward, bool) or not math.isfinite(reward):
            raise EnvironmentOutputError(f"{where}: SeatTurn.rewards[{seat!r}] must be a finite number, got "
                                         f"{reward!r:.40}")
    read_info(result.info, f"{where}: SeatTurn.info")
    return result


__all__ = ["SeatTurn", "SeatedEnvironment", "check_seat_turn"]
