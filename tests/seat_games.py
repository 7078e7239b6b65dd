"""A two-player game written for the tests of games with several seats (no textarena needed), and a scripted policy
that plays it.

Race: seats A and B add 1 or 2 in turn (a move is "[1]" or "[2]" anywhere in the text) to a running total; whoever
brings it to the row's ``target`` (default 5) wins (+1, the other -1), a move without "[1]"/"[2]" loses at once
(-1, the other +1). Each seat's first observation says who it is; later ones say what the other seat played. A row's
``fail`` column breaks the game on purpose: "reset" / "step" raise, "hang" sleeps in step, "stranger" names a seat
the game was not given, "garbage" returns a dict instead of a SeatTurn."""

from __future__ import annotations

import re
import time
from typing import Any

from trl_agentic.environments.seats import SeatedEnvironment, SeatTurn

MOVE = re.compile(r"\[([12])\]")


class Race(SeatedEnvironment):
    seats = ("A", "B")

    def reset(self, target: int = 5, fail: str | None = None, **row: Any) -> SeatTurn:
        if fail == "reset":
            raise RuntimeError("the race could not start")
        self.total, self.target, self.fail, self.mover, self.told = 0, target, fail, 0, {"A"}
        return SeatTurn("A", f"You are A. Add [1] or [2]; reach {target} to win. Total 0.")

    def step(self, action: str) -> Any:
        if self.fail == "step":
            raise ValueError("the race broke")
        if self.fail == "hang":
            time.sleep(5)
        if self.fail == "garbage":
            return {"seat": "B"}
        me, other = self.seats[self.mover], self.seats[1 - self.mover]
        if self.fail == "stranger":
            return SeatTurn("C", "hello")
        found = MOVE.search(action)
        if found is None:
            return SeatTurn(None, rewards={me: -1.0, other: 1.0})
        self.total += int(found.group(1))
        if self.total >= self.target:
            return SeatTurn(None, rewards={me: 1.0, other: -1.0})
        self.mover = 1 - self.mover
        opening = "" if other in self.told else f"You are {other}. Add [1] or [2]; reach {self.target} to win. "
        self.told.add(other)
        return SeatTurn(other, f"{opening}{me} played [{found.group(1)}]. Total {self.total}.")


def race_rows(n: int, **columns: Any) -> list[dict[str, Any]]:
    """``n`` rows of a text prompt and the row's columns."""
    return [{"prompt": "Race.\n", **columns} for _ in range(n)]


def seat_reward(completions, trajectory, **kwargs):
    """Each run's game reward (its turn rewards summed)."""
    return [t.env_reward for t in trajectory]
