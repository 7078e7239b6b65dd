"""A walk on a grid with partial observation, through TRL's own interface: the long-horizon task sized to a CPU
(issue 59). Every successful episode takes at least six model turns of 24 tokens, and its second half needs what an
earlier observation said.

The world is a 5 x 5 grid of cells ``(x, y)``, ``0 <= x, y <= 4``. The prompt gives the walker's start and the way
to an item (``"You are at (0, 4) on a 5 by 5 grid. The key is 3 steps east and 1 step south of you: it tells you the
way to the door. Pick it up, then walk to the door."``). The walker moves one cell per tool call (``north``: y + 1,
``south``: y - 1, ``east``: x + 1, ``west``: x - 1; no arguments) and each call answers with its new position alone
(``"You are at (1, 4)."``; a step off the grid stays put: ``"A wall. You are at (0, 4)."``). Stepping onto the item
picks it up, and that observation, once, gives the way to the goal (``"You are at (3, 3). You pick up the key. It
says: the door is 2 steps north and 1 step east of here."``); the later observations give the position only, so
every step of the second half follows a way read turns earlier, counting the steps taken since. Stepping onto the
goal with the item ends the walk (``"... You open the door. The walk is over."``); the model then replies (a turn
without a tool call), which ends the rollout. Each way names its two directions in a random order (the x part first
or the y part first), which the shortest walk follows.

A first design gave the item's and the goal's cells as coordinates (``"the door is at (4, 4)"``): SmolLM2-135M after
SFT on 64 of its walks learned the calls' format and not the comparison of coordinates (held-out 0.01, walking west
into the wall; ``benchmarks/reports/issue59/walk_abs_d64_e1_s0_sft.json``). A way in steps asks for reading,
counting and remembering instead, which such a model can learn.

Worlds: the item at least 2 steps from the start, the goal at least 2 from the item, the shortest walk (start ->
item -> goal) :data:`MIN_MOVES` to :data:`MAX_MOVES` steps, so a success takes 6 to 8 model turns (the steps and the
reply; 24 tokens a step with SmolLM2's tokenizer and ``model.py``'s template, ``<|im_end|>`` included). Two
generators, each a wording of the prompt, of the ways and of the position, and a list of stories (what the item and
the goal are, the wording of the other observations): :data:`GENERATORS`' ``train`` (training, SFT and the held-out
set) and ``transfer`` (other stories, other wording of everything; never trained on). :func:`task_rows` draws the sets
from a seed, each from its own; no held-out or transfer world (start, item, goal, and the order of each way) is a
training world.

Signals (:class:`WalkEnvironment`):

- the outcome, ``get_reward()``: 1 when the walk reached the goal with the item, else 0 (TRL's trainers add it as a
  reward function of weight 1); :func:`walk_success` reads the same from the rollout's messages;
- the state, ``_state_key()``: ``"x,y,item"`` (``item`` 1 once picked up), the state the last turn led to: GiGPO's
  anchor (Feng et al. 2025, arXiv 2505.10978). The G rollouts of one prompt share start and world, so states repeat
  across the group, and the steps taken from one state form a step group;
- per step, ``_progress``: the decrease of the Manhattan distance to the current target (the item until it is picked
  up, then the goal): +1 toward it, -1 away, 0 for a step into a wall or after the end. Informative (an optimal walk
  scores +1 at every step) but not the outcome (a walk can make progress and run out of turns, or wander and still
  arrive). :class:`ShapedWalkEnvironment` gives it as each turn's reward (``_turn_reward()``: :data:`SHAPING` times
  the progress of the turn's steps); :class:`WalkEnvironment` keeps it for the logs alone, so that its turns earn
  nothing but the outcome.

Underscore names: TRL 1.16 offers every public method of an ``environment_factory`` class but ``reset`` and
``get_reward`` as a tool, and calls none of the others (our engine reads ``_state_key`` and ``_turn_reward`` after
every turn).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SIZE = 5
"""Cells per side of the grid."""

MIN_MOVES, MAX_MOVES = 5, 7
"""The shortest walk of a world, in steps: a success takes one more model turn (the reply)."""

INSTRUCTION = "Walk with the tools, one step per call. When the walk is over, reply Done."
"""The user message's first line."""

DONE = "The walk is over."
"""The last sentence of the observation that ends a walk (and of every call after it)."""

REPLY = "Done."
"""The demonstrations' reply once the walk is over."""

SHAPING = 0.1
"""A turn's reward per step of progress (:class:`ShapedWalkEnvironment`): an optimal walk's turns earn 0.5 to 0.7 in
all, below the outcome's 1, so that shaping guides a walk without paying more than arriving."""

MOVES = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}


@dataclass(frozen=True)
class Story:
    """One kind of walk: ``task`` (the prompt after the start: ``{way}`` the way to the item), ``wall`` (before the
    position when a step leaves the grid), ``pickup`` (after the position on the item: ``{way}`` the way to the goal)
    and ``finish`` (after the position on the goal, with the item)."""

    task: str
    wall: str
    pickup: str
    finish: str


@dataclass(frozen=True)
class Generator:
    """A generator's wording: ``opening`` (the prompt's start: ``{x}, {y}``), ``position`` (every observation:
    ``{x}, {y}``), a way's ``part`` (``{n}`` steps toward ``{direction}``, ``{s}`` the plural's ending) and the
    ``joiner`` of its two parts, and its ``stories`` by name."""

    opening: str
    position: str
    part: str
    joiner: str
    stories: dict[str, Story]

    def way(self, offset: Cell, order: str) -> str:
        """The way of ``offset`` (dx, dy) in this wording, the x part first when ``order`` is ``"xy"``."""
        parts = {"x": (offset[0], "east", "west"), "y": (offset[1], "north", "south")}
        return self.joiner.join(self.part.format(n=abs(n), s="s" if abs(n) > 1 else "", direction=up if n > 0 else down)
                                for n, up, down in (parts[axis] for axis in order) if n)


GENERATORS = {
    "train": Generator("You are at ({x}, {y}) on a 5 by 5 grid.", "You are at ({x}, {y}).", "{n} step{s} {direction}",
                       " and ", {
        "key": Story("The key is {way} of you: it tells you the way to the door. Pick it up, then walk to the door.",
                     "A wall.", "You pick up the key. It says: the door is {way} of here.", "You open the door."),
        "ticket": Story("The ticket is {way} of you: it names the way to your train. Get it, then walk to the train.",
                        "A fence.", "You get the ticket. It says: your train is {way} of here.",
                        "You board the train."),
        "letter": Story("The letter is {way} of you: its address is where you deliver it. Collect it, then walk "
                        "there.", "A hedge.", "You collect the letter. It says: deliver me {way} of here.",
                        "You deliver the letter."),
        "lamp": Story("The lamp is {way} of you: a note on it gives the way to the cave. Take it, then walk to the "
                      "cave.", "A rock.", "You take the lamp. The note says: the cave is {way} of here.",
                      "You enter the cave."),
    }),
    "transfer": Generator("Start: ({x}, {y}), on a 5 by 5 grid.", "Now at ({x}, {y}).", "{n} pace{s} {direction}",
                          ", then ", {
        "map": Story("A map lies {way} from you and shows the way to the treasure. Fetch the map, then go to the "
                     "treasure.", "The edge of the island.",
                     "You unfold the map. The treasure is buried {way} from here.", "You dig up the treasure."),
        "clue": Story("Your friend left a clue {way} from you that says where they wait. Read the clue, then meet "
                      "your friend.", "The edge of the park.", "You read the clue. Your friend waits {way} from here.",
                      "You meet your friend."),
    }),
}
"""The two generators: ``train`` (training, SFT and the held-out set) and ``transfer`` (never trained on: other
stories, other wording of the prompt and of every observation, the same walk)."""

STORIES = {name: (generator, story) for generator in GENERATORS.values() for name, story in generator.stories.items()}
"""Every story by name, with its generator (what a row's ``story`` column names)."""

Cell = tuple[int, int]
World = tuple[Cell, Cell, Cell]
"""(start, item, goal)."""


def distance(a: Cell, b: Cell) -> int:
    """Manhattan distance: the fewest steps from ``a`` to ``b``."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def draw_world(rng: random.Random) -> World:
    """A world of the task (module docstring), drawn from ``rng``: the item at least 2 steps from the start, the goal
    at least 2 from the item, :data:`MIN_MOVES` to :data:`MAX_MOVES` steps in all."""
    while True:
        start, item, goal = ((rng.randrange(SIZE), rng.randrange(SIZE)) for _ in range(3))
        first, second = distance(start, item), distance(item, goal)
        if first >= 2 and second >= 2 and MIN_MOVES <= first + second <= MAX_MOVES:
            return start, item, goal


def offset(a: Sequence[int], b: Sequence[int]) -> Cell:
    """The (dx, dy) from cell ``a`` to cell ``b``."""
    return b[0] - a[0], b[1] - a[1]


def world_of(row: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a row's walk (its ``start``, ``item`` and ``goal`` cells and the order of each way), the story
    apart."""
    return (*(tuple(row[key]) for key in ("start", "item", "goal")), row["item_order"], row["goal_order"])


def make_rows(n: int, seed: int, generator: str = "train", exclude: frozenset | set = frozenset()) -> list[dict[str, Any]]:
    """``n`` walks of ``generator`` (``"train"`` or ``"transfer"``) drawn from ``seed``: the stories in turn, the
    worlds and the order of each way at random, none whose :func:`world_of` is in ``exclude``. A row: ``question``
    (the task as the prompt states it), ``story``, ``start``/``item``/``goal`` (``[x, y]``) and ``item_order`` /
    ``goal_order`` (``"xy"`` or ``"yx"``: the way to each, x part first or y part first), what ``reset`` reads, and
    ``golden_answers`` (the goal, ``"(x, y)"``: where the walk must end)."""
    rng = random.Random(seed)
    stories = list(GENERATORS[generator].stories)
    rows = []
    for k in range(n):
        while True:
            start, item, goal = draw_world(rng)
            row = {"start": list(start), "item": list(item), "goal": list(goal),
                   "item_order": rng.choice(("xy", "yx")), "goal_order": rng.choice(("xy", "yx"))}
            if world_of(row) not in exclude:
                break
        story = stories[k % len(stories)]
        wording, told = STORIES[story]
        way = wording.way(offset(start, item), row["item_order"])
        question = f"{wording.opening.format(x=start[0], y=start[1])} {told.task.format(way=way)}"
        rows.append({"question": question, "story": story, **row, "golden_answers": [f"({goal[0]}, {goal[1]})"]})
    return rows


def task_rows(train: int, test: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The task's sets (as ``arithmetic.task_rows``): ``train`` training and ``test`` held-out walks of the training
    generator and ``test`` of the transfer generator, each from its own seed derived from ``seed``; no held-out or
    transfer world is a training world."""
    rows = make_rows(train, 1000 * seed + 1)
    seen = {world_of(row) for row in rows}
    return {"train": rows, "test": make_rows(test, 1000 * seed + 2, exclude=seen),
            "transfer": make_rows(test, 1000 * seed + 3, "transfer", exclude=seen)}


class WalkEnvironment:
    """A TRL environment (``environment_factory=WalkEnvironment``): four tools, one per direction, ``get_reward``
    (the outcome), the state key and each step's progress, which TRL ignores (module docstring). ``reset(**row)``
    reads the row's ``story``, ``start``, ``item`` and ``goal``."""

    def __init__(self) -> None:
        self._wording, self._story = STORIES["key"]
        self._position: Cell = (0, 0)
        self._item: Cell = (0, 0)
        self._goal: Cell = (0, 0)
        self._carrying = self._done = False
        self._progress: list[float] = []

    def reset(self, story: str = "key", start: Sequence[int] = (0, 0), item: Sequence[int] = (0, 0),
              goal: Sequence[int] = (0, 0), goal_order: str = "xy", **row: Any) -> None:
        self._wording, self._story = STORIES[story]
        self._position, self._item, self._goal = (start[0], start[1]), (item[0], item[1]), (goal[0], goal[1])
        self._goal_order = goal_order
        self._carrying = self._done = False
        self._progress = []

    def east(self) -> str:
        """Step east: x + 1."""
        return self._step("east")

    def north(self) -> str:
        """Step north: y + 1."""
        return self._step("north")

    def south(self) -> str:
        """Step south: y - 1."""
        return self._step("south")

    def west(self) -> str:
        """Step west: x - 1."""
        return self._step("west")

    def get_reward(self) -> float:
        return float(self._done)

    def _state_key(self) -> str:
        """The state the last turn led to, which the next is taken from: ``"x,y,item"`` (``item`` 1 once picked up;
        the goal, start and story are the row's, the same for a group's rollouts)."""
        return f"{self._position[0]},{self._position[1]},{int(self._carrying)}"

    def _target(self) -> Cell:
        return self._goal if self._carrying else self._item

    def _step(self, direction: str) -> str:
        """Move one cell (module docstring); records the step's progress."""
        story, position, (x, y) = self._story, self._wording.position, self._position
        if self._done:
            self._progress.append(0.0)
            return DONE
        before = distance(self._position, self._target())
        dx, dy = MOVES[direction]
        inside = 0 <= x + dx < SIZE and 0 <= y + dy < SIZE
        if inside:
            self._position = x, y = x + dx, y + dy
        self._progress.append(float(before - distance(self._position, self._target())))
        text = position.format(x=x, y=y) if inside else f"{story.wall} {position.format(x=x, y=y)}"
        if not self._carrying and self._position == self._item:
            self._carrying = True
            text += " " + story.pickup.format(way=self._wording.way(offset(self._item, self._goal), self._goal_order))
        elif self._carrying and self._position == self._goal:
            self._done = True
            text += f" {story.finish} {DONE}"
        return text


class ShapedWalkEnvironment(WalkEnvironment):
    """:class:`WalkEnvironment` whose turns earn :data:`SHAPING` times their progress (``_turn_reward``): the per-turn
    signal as a reward, for the trainers that read turn rewards (PPO's turn-level GAE, GiGPO's step returns, GRPO
    through ``TurnReward``)."""

    _rewarded = 0  # the steps whose progress a turn reward has given

    def reset(self, **row: Any) -> None:
        super().reset(**row)
        self._rewarded = 0

    def _turn_reward(self) -> float:
        """:data:`SHAPING` times the progress of the steps taken since the last call (our engine calls it once after
        every turn): the turn's step, 0 for a turn without one."""
        reward, self._rewarded = SHAPING * sum(self._progress[self._rewarded:]), len(self._progress)
        return reward


def shortest_walk(row: dict[str, Any]) -> list[str]:
    """The steps of an optimal walk (the demonstrations' policy): to the item, then to the goal, each way as it is
    told (its first part, then its second)."""
    steps = []
    for a, b, order in ((row["start"], row["item"], row["item_order"]), (row["item"], row["goal"], row["goal_order"])):
        dx, dy = offset(a, b)
        legs = {"x": ["east" if dx > 0 else "west"] * abs(dx), "y": ["north" if dy > 0 else "south"] * abs(dy)}
        steps += legs[order[0]] + legs[order[1]]
    return steps


def demonstration(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The worked messages of ``row``: the :func:`shortest_walk`'s calls, each answered by a
    :class:`WalkEnvironment`, then :data:`REPLY`."""
    environment = WalkEnvironment()
    environment.reset(**row)
    messages: list[dict[str, Any]] = []
    for step in shortest_walk(row):
        messages += [{"role": "assistant", "content": "",
                      "tool_calls": [{"type": "function", "function": {"name": step, "arguments": {}}}]},
                     {"role": "tool", "name": step, "content": getattr(environment, step)()}]
    return [*messages, {"role": "assistant", "content": REPLY}]


def walk_success(completions: Sequence[Any], trajectory: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
    """TRL reward function: 1 when a tool message of the rollout ends the walk (its text holds :data:`DONE`), else
    0: ``get_reward`` read from the messages."""
    from benchmarks.learning_native.task import rollout_messages

    return [float(any(m.get("role") == "tool" and DONE in str(m.get("content")) for m in messages))
            for messages in rollout_messages(completions, trajectory)]


def progress(completions: Sequence[Any], environments: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """The per-turn signal, logged as a reward of weight 0: each rollout's mean step progress (``_progress``; 1.0
    for an optimal walk; 0 without a step; ``None`` without environments)."""
    if environments is None:
        return [None] * len(completions)
    rewards = [getattr(e, "_progress", []) for e in environments]
    return [sum(r) / len(r) if r else 0.0 for r in rewards]


def tool_schemas() -> list[Any]:
    """The tools the model is shown: the environment's four methods, in TRL's order."""
    from trl_agentic.environments.native_tools import tool_methods

    return tool_methods(WalkEnvironment())
