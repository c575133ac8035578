"""Generated ALFWorld games: PDDL problems for ALFWorld's six task types over procedurally generated
rooms, in ALFWorld's own game-file format (so `swerl.envs.alfworld.game` loads them exactly as it loads
the official ones).

- Rooms (kitchen, living room, bedroom, bathroom) are drawn from a seed: receptacles of ALFRED's
  types (openable ones closed), each at its own location, and objects of ALFRED's types placed in
  receptacles that may hold them (ALFRED's compatibility table, shipped in the alfworld wheel). Ids
  are ALFRED-style (`Cabinet|417`, escaped as ALFRED escapes them: `Cabinet_bar_417`), so ALFWorld's
  demangler names them `cabinet 1`, `cabinet 2`, ...
- Tasks: the goal formula and the task sentence come from ALFWorld's goal library (shipped in the
  wheel), filled with an object and receptacle valid in the room and not satisfied at the start.
- Every game is checked by the planner: Fast Downward (through TextWorld) must find a plan (planning,
  as ALFRED does, on the task's objects only: see `planning_problem`), and that plan replayed command
  by command through the full game must win. The plan is kept as `walkthrough`.
- Splits: train and held-out games live in disjoint sets of rooms (held-out rooms are never seen in
  training), listed in `splits.json`; each game's room is recorded in its `traj_data.json`.

Everything is drawn from `random.Random` streams derived from the seed and written with sorted keys,
so the same arguments write the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from swerl.envs.alfworld.game import GAME_FILE, SPLITS_FILE, TASK_TYPES, TRAJ_FILE

GENERATOR_VERSION = 1

# (receptacle type, min count, max count) per room kind; ALFRED's receptacle types.
ROOM_RECEPTACLES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "Kitchen": (("Cabinet", 3, 8), ("Drawer", 2, 5), ("CounterTop", 1, 3), ("Fridge", 1, 1),
                ("Microwave", 1, 1), ("SinkBasin", 1, 1), ("StoveBurner", 2, 4), ("GarbageCan", 1, 1),
                ("CoffeeMachine", 1, 1), ("Toaster", 0, 1), ("DiningTable", 0, 1), ("Shelf", 0, 2)),
    "LivingRoom": (("Sofa", 1, 1), ("ArmChair", 0, 2), ("CoffeeTable", 1, 2), ("SideTable", 1, 2),
                   ("TVStand", 0, 1), ("Shelf", 0, 3), ("Drawer", 1, 4), ("Cabinet", 0, 3),
                   ("GarbageCan", 1, 1), ("Dresser", 0, 1), ("Desk", 0, 1)),
    "Bedroom": (("Bed", 1, 1), ("Desk", 0, 1), ("SideTable", 1, 2), ("Dresser", 1, 1), ("Drawer", 2, 5),
                ("Shelf", 0, 3), ("GarbageCan", 1, 1), ("LaundryHamper", 0, 1), ("Safe", 0, 1),
                ("ArmChair", 0, 1)),
    "Bathroom": (("Toilet", 1, 1), ("SinkBasin", 1, 2), ("BathtubBasin", 0, 1), ("CounterTop", 1, 1),
                 ("Cabinet", 2, 4), ("Drawer", 0, 3), ("GarbageCan", 1, 1), ("TowelHolder", 0, 1),
                 ("HandTowelHolder", 0, 1), ("ToiletPaperHanger", 1, 1), ("Shelf", 0, 2)),
}
# Object types that may appear in each room kind (ALFRED's object types).
ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    "Kitchen": ("Apple", "Bread", "ButterKnife", "Bowl", "Cup", "DishSponge", "Egg", "Fork", "Kettle",
                "Knife", "Ladle", "Lettuce", "Mug", "Pan", "PepperShaker", "Plate", "Pot", "Potato",
                "SaltShaker", "SoapBottle", "Spatula", "Spoon", "Tomato", "WineBottle", "Glassbottle"),
    "LivingRoom": ("Book", "Box", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Newspaper", "Pillow",
                   "RemoteControl", "Statue", "TissueBox", "Vase", "Watch", "WateringCan", "Bowl", "Plate"),
    "Bedroom": ("AlarmClock", "BaseballBat", "BasketBall", "Book", "CD", "CellPhone", "CreditCard",
                "KeyChain", "Laptop", "Mug", "Pen", "Pencil", "Pillow", "TennisRacket", "Watch", "Bowl",
                "Cup"),
    "Bathroom": ("Candle", "Cloth", "HandTowel", "Plunger", "ScrubBrush", "SoapBar", "SoapBottle",
                 "SprayBottle", "ToiletPaper", "Towel", "TissueBox", "DishSponge"),
}
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser")
"""Where a desk lamp stands (lamps are fixed: toggleable, not pickupable)."""
LOOK_AT_OBJECTS = ("AlarmClock", "Book", "Bowl", "Box", "CD", "CellPhone", "CreditCard", "Cup", "KeyChain",
                   "Laptop", "Mug", "Newspaper", "Pen", "Pencil", "Pillow", "Plate", "RemoteControl",
                   "Statue", "Vase", "Watch")
ROOM_KINDS_OF_TASK: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("Kitchen", "LivingRoom", "Bedroom", "Bathroom"),
    "look_at_obj_in_light": ("LivingRoom", "Bedroom"),
    "pick_clean_then_place_in_recep": ("Kitchen", "Bathroom"),
    "pick_heat_then_place_in_recep": ("Kitchen",),
    "pick_cool_then_place_in_recep": ("Kitchen",),
    "pick_two_obj_and_place": ("Kitchen", "LivingRoom", "Bedroom", "Bathroom"),
}
# Types the domain's actions name as constants: they must exist as objects in every problem.
DOMAIN_CONSTANT_TYPES = (("SinkBasinType", "rtype"), ("MicrowaveType", "rtype"), ("FridgeType", "rtype"),
                         ("KnifeType", "otype"), ("ButterKnifeType", "otype"))
MAX_ATTEMPTS = 40
"""Tries (room + task draws) per game before giving up with an error."""


def _constants() -> Any:
    import alfworld.gen.constants as c

    return c


def _goal_library() -> dict[str, Any]:
    import alfworld.gen.goal_library as glib

    return glib.gdict


def _alfred_escape(text: str) -> str:
    """ALFRED's escaping of ids into PDDL names (one pass, so an inserted '_' is never re-escaped)."""
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in text)


@dataclass(frozen=True)
class Receptacle:
    """A receptacle of a generated room."""

    rtype: str
    """ALFRED receptacle type (`Cabinet`)."""
    pddl_id: str
    """Escaped ALFRED id, a PDDL name."""
    location: str
    """PDDL name of its location."""


@dataclass(frozen=True)
class Thing:
    """An object of a generated room, and the receptacle holding it."""

    otype: str
    """ALFRED object type (`Apple`)."""
    pddl_id: str
    """Escaped ALFRED id, a PDDL name."""
    receptacle: Receptacle
    """Where it is at the start."""


@dataclass(frozen=True)
class Room:
    """A procedurally generated room."""

    name: str
    """Stable name (`room7`), recorded in each game's traj_data.json."""
    kind: str
    """Kitchen, LivingRoom, Bedroom or Bathroom."""
    receptacles: tuple[Receptacle, ...]
    """Its receptacles."""
    things: tuple[Thing, ...]
    """Its objects."""
    start: str
    """The agent's start location (no receptacle there)."""

    def fingerprint(self) -> str:
        """A hash of the layout: two rooms with the same fingerprint are the same room."""
        text = json.dumps([self.kind, [(r.rtype, r.pddl_id) for r in self.receptacles],
                           [(t.otype, t.pddl_id, t.receptacle.pddl_id) for t in self.things]])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_room(rng: random.Random, kind: str, name: str) -> Room:
    """Draw a room of `kind`: receptacles, their locations, and objects placed where they fit."""
    c = _constants()
    used_ids: set[str] = set()
    used_locs: set[str] = set()

    def fresh_loc() -> str:
        while True:
            loc = (f"loc|{rng.randint(-12, 12)}|{rng.randint(-12, 12)}|{rng.randint(0, 3)}"
                   f"|{rng.choice((0, 30, 45, 60))}")
            if loc not in used_locs:
                used_locs.add(loc)
                return _alfred_escape(loc)

    def fresh_id(otype: str, suffix: str = "") -> str:
        while True:
            # ALFRED's ids carry three coordinates (`Cabinet|+01.25|+00.40|-02.10`); a random serial
            # plays the same part (unique, and unrelated to the number the demangler gives) at a fifth
            # of the size, which every game file repeats a few hundred times
            raw = f"{otype}|{rng.randint(100, 999)}{suffix}"
            if raw not in used_ids:
                used_ids.add(raw)
                return _alfred_escape(raw)

    recs: list[Receptacle] = []
    for rtype, lo, hi in ROOM_RECEPTACLES[kind]:
        for _ in range(rng.randint(lo, hi)):
            # ALFRED names basins after their fixture: Sink|x|y|z|SinkBasin
            if rtype in ("SinkBasin", "BathtubBasin"):
                pid = fresh_id(rtype.removesuffix("Basin"), f"|{rtype}")
            else:
                pid = fresh_id(rtype)
            recs.append(Receptacle(rtype, pid, fresh_loc()))
    if kind in ("LivingRoom", "Bedroom") and not any(r.rtype in LAMP_HOLDERS for r in recs):
        recs.append(Receptacle("SideTable", fresh_id("SideTable"), fresh_loc()))
    start = fresh_loc()
    things: list[Thing] = []
    for otype in ROOM_OBJECTS[kind]:
        if rng.random() < 0.3:
            continue
        holders = [r for r in recs if otype in c.VAL_RECEPTACLE_OBJECTS.get(r.rtype, ())]
        if not holders:
            continue
        for _ in range(rng.choice((1, 1, 2, 3))):
            things.append(Thing(otype, fresh_id(otype), rng.choice(holders)))
    if kind in ("LivingRoom", "Bedroom"):
        holders = [r for r in recs if r.rtype in LAMP_HOLDERS]
        things.append(Thing("DeskLamp", fresh_id("DeskLamp"), rng.choice(holders)))
    return Room(name=name, kind=kind, receptacles=tuple(recs), things=tuple(things), start=start)


@dataclass(frozen=True)
class Task:
    """A task drawn for a room: ALFWorld's task type and pddl_params."""

    task_type: str
    """One of TASK_TYPES."""
    object_target: str
    """ALFRED object type to act on."""
    parent_target: str
    """Receptacle type to put it in ('' for look_at_obj_in_light)."""
    toggle_target: str
    """Lamp type for look_at_obj_in_light ('' otherwise)."""


def draw_task(rng: random.Random, room: Room, task_type: str) -> Task | None:
    """A task of `task_type` valid in `room` and not already achieved, or None when the room has none."""
    c = _constants()
    rtypes = sorted({r.rtype for r in room.receptacles})
    counts: dict[str, int] = {}
    for t in room.things:
        counts[t.otype] = counts.get(t.otype, 0) + 1
    movable = sorted(o for o in counts if o != "DeskLamp")
    if task_type == "look_at_obj_in_light":
        if "DeskLamp" not in counts:
            return None
        objs = [o for o in movable if o in LOOK_AT_OBJECTS]
        return Task(task_type, rng.choice(objs), "", "DeskLamp") if objs else None
    need = {"pick_clean_then_place_in_recep": ("Cleanable", "SinkBasin"),
            "pick_heat_then_place_in_recep": ("Heatable", "Microwave"),
            "pick_cool_then_place_in_recep": ("Coolable", "Fridge")}.get(task_type)
    objs = movable
    if need:
        if need[1] not in rtypes:
            return None
        objs = [o for o in objs if o in c.VAL_ACTION_OBJECTS[need[0]]]
    if task_type == "pick_two_obj_and_place":
        objs = [o for o in objs if counts[o] >= 2]
    options = []
    for o in objs:
        already = {t.receptacle.rtype for t in room.things if t.otype == o}
        for rt in rtypes:
            if o not in c.VAL_RECEPTACLE_OBJECTS.get(rt, ()) or rt in already:
                continue
            if need and rt == need[1]:
                continue  # the appliance itself is no destination
            options.append((o, rt))
    if not options:
        return None
    o, rt = rng.choice(options)
    return Task(task_type, o, rt, "")


def problem_text(room: Room, task: Task, name: str) -> str:
    """The PDDL problem (domain `alfred`, as shipped in the alfworld wheel) of `task` in `room`."""
    c = _constants()
    things = sorted(room.things, key=lambda t: t.pddl_id)
    recs = sorted(room.receptacles, key=lambda r: r.pddl_id)
    otypes = sorted({f"{t.otype}Type" for t in things} | {t for t, k in DOMAIN_CONSTANT_TYPES if k == "otype"}
                    | {f"{task.object_target}Type"})
    rtypes = sorted({f"{r.rtype}Type" for r in recs} | {t for t, k in DOMAIN_CONSTANT_TYPES if k == "rtype"})
    locations = sorted({r.location for r in recs} | {room.start})
    objects = (["agent1 - agent"] + [f"{t} - otype" for t in otypes] + [f"{t} - rtype" for t in rtypes]
               + [f"{t.pddl_id} - object" for t in things] + [f"{r.pddl_id} - receptacle" for r in recs]
               + [f"{loc} - location" for loc in locations])
    init = ["(= (total-cost) 0)", f"(atLocation agent1 {room.start})"]
    for r in recs:
        init.append(f"(receptacleType {r.pddl_id} {r.rtype}Type)")
        init.append(f"(receptacleAtLocation {r.pddl_id} {r.location})")
        if r.rtype in c.OPENABLE_CLASS_SET:
            init.append(f"(openable {r.pddl_id})")
    actions = c.VAL_ACTION_OBJECTS
    for t in things:
        init.append(f"(objectType {t.pddl_id} {t.otype}Type)")
        init.append(f"(inReceptacle {t.pddl_id} {t.receptacle.pddl_id})")
        init.append(f"(objectAtLocation {t.pddl_id} {t.receptacle.location})")
        if t.otype in actions["Toggleable"]:
            init.append(f"(toggleable {t.pddl_id})")
            continue  # lamps stay where they are
        init.append(f"(pickupable {t.pddl_id})")
        for prop, key in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"),
                          ("sliceable", "Sliceable")):
            if t.otype in actions[key]:
                init.append(f"({prop} {t.pddl_id})")
    present_o = sorted({t.otype for t in things if t.otype not in actions["Toggleable"]})
    for rt in sorted({r.rtype for r in recs}):
        for o in present_o:
            if o in c.VAL_RECEPTACLE_OBJECTS.get(rt, ()):
                init.append(f"(canContain {rt}Type {o}Type)")
    goal = _goal_library()[task.task_type]["pddl"]
    goal = goal.format(obj=task.object_target, recep=task.parent_target, toggle=task.toggle_target, mrecep="")
    goal = goal.replace("#", "-")
    pad = "\n        "
    return (f"\n(define (problem {name})\n    (:domain alfred)\n"
            f"    (:objects{pad}{pad.join(objects)}\n    )\n    (:init{pad}{pad.join(init)}\n    )\n{goal}")


def planning_problem(room: Room, task: Task, name: str) -> str:
    """The problem the planner solves: the game's problem with only the task's objects, as ALFRED's own
    planning problems are. Other objects change no precondition of the domain (receptacles have no
    capacity), so the plan also plays in the full game, where it is replayed before it is kept; and
    Fast Downward's search over every object of a furnished room takes tens of seconds (pick-two's
    nested quantifiers over all pairs of objects) where this takes about one."""
    keep = {task.object_target, task.toggle_target}
    return problem_text(replace(room, things=tuple(t for t in room.things if t.otype in keep)), task, name)


def task_sentence(rng: random.Random, task: Task) -> str:
    """ALFWorld's templated task sentence (its goal library's templates, object names lower-cased)."""
    template = rng.choice(_goal_library()[task.task_type]["templates"])
    return template.format(obj=task.object_target.lower(), recep=task.parent_target.lower(),
                           toggle=task.toggle_target.lower(), mrecep="")


def _shipped_logic() -> tuple[str, str]:
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    return Path(ALFRED_PDDL_PATH).read_text(), Path(ALFRED_TWL2_PATH).read_text()


class Planner:
    """TextWorld's PDDL environment with the planner on, as ALFWorld's expert checks games."""

    def __init__(self) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs import PddlEnv

        infos = textworld.EnvInfos(admissible_commands=True, won=True, policy_commands=True)
        self.env = AlfredDemangler(PddlEnv(infos), shuffle=False)

    def solve(self, gamedata: dict[str, Any], planning_problem: str | None = None) -> list[str] | None:
        """The planner's plan, if replaying it through the game wins; else None. `planning_problem`:
        plan on this problem instead (same start, a goal the real one is implied by), then replay the
        plan on the real game."""
        self.env.request_infos.policy_commands = True
        self.env.load({**gamedata, "pddl_problem": planning_problem} if planning_problem else gamedata)
        state = self.env.reset()
        plan = list(state["policy_commands"] or [])
        # replanning after every replayed step would cost a planner call each
        self.env.request_infos.policy_commands = False
        if planning_problem:
            self.env.load(gamedata)
            state = self.env.reset()
        if not plan or state["won"]:
            return None
        for cmd in plan:
            if cmd not in state["admissible_commands"]:
                return None
            state, _, _ = self.env.step(cmd)
        return plan if state["won"] else None

    def close(self) -> None:
        self.env.close()


@dataclass(frozen=True)
class GeneratedGame:
    """One written game."""

    game_id: str
    """Its id (path under the output folder)."""
    split: str
    """train or heldout."""
    task_type: str
    """ALFWorld task type."""
    room: str
    """The room's name."""
    plan_len: int
    """Steps of the expert plan."""


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def generate_alfworld(out: str | Path, *, seed: int = 0, train: int = 8, heldout: int = 4,
                      train_rooms_per_kind: int = 3, heldout_rooms_per_kind: int = 2,
                      task_types: tuple[str, ...] = tuple(TASK_TYPES.values()),
                      log: Callable[[str], None] | None = None) -> list[GeneratedGame]:
    """Write `train` + `heldout` games of each task type to `out` (replacing the games there) plus
    `splits.json`; see the module docstring. Returns the games in writing order."""
    if train < 0 or heldout < 0 or train + heldout == 0:
        raise ValueError(f"need train >= 0, heldout >= 0 and at least one game, got {train}, {heldout}")
    if train_rooms_per_kind < 1 or heldout_rooms_per_kind < 1:
        raise ValueError("need at least one room per kind in each split")
    unknown = sorted(set(task_types) - set(TASK_TYPES.values()))
    if unknown:
        raise ValueError(f"unknown task types {unknown}; ALFWorld's are {', '.join(TASK_TYPES.values())}")
    out = Path(out)
    domain, grammar = _shipped_logic()
    kinds = sorted(ROOM_RECEPTACLES)
    # Disjoint room pools: held-out rooms are numbered after every train room, from their own streams.
    pools: dict[str, dict[str, list[Room]]] = {}
    n = 0
    for split, per_kind in (("train", train_rooms_per_kind), ("heldout", heldout_rooms_per_kind)):
        pools[split] = {}
        for kind in kinds:
            rooms = []
            for _ in range(per_kind):
                rooms.append(make_room(random.Random(f"{seed}/room/{n}"), kind, f"room{n}"))
                n += 1
            pools[split][kind] = rooms
    for split in ("train", "heldout"):
        if (out / split).exists():
            # only a set this generator wrote (it has the manifest) is replaced, never e.g. ALFWorld's own
            if not (out / SPLITS_FILE).is_file():
                raise ValueError(f"{out / split} exists but {out} has no {SPLITS_FILE}: it was not written "
                                 "by this generator; choose an empty --out folder")
            shutil.rmtree(out / split)
    planner = Planner()
    games: list[GeneratedGame] = []
    splits: dict[str, list[str]] = {"train": [], "heldout": []}
    try:
        for split, count in (("train", train), ("heldout", heldout)):
            for task_type in task_types:
                rooms = [r for k in ROOM_KINDS_OF_TASK[task_type] for r in pools[split][k]]
                for i in range(count):
                    rng = random.Random(f"{seed}/{split}/{task_type}/{i}")
                    for _attempt in range(MAX_ATTEMPTS):
                        room = rooms[(i + _attempt) % len(rooms)]
                        task = draw_task(rng, room, task_type)
                        if task is None:
                            continue
                        name = (f"{task_type}-{task.object_target}-None-"
                                f"{task.parent_target or task.toggle_target}-{room.name}")
                        trial = f"trial_{i:05d}"
                        game_id = f"{split}/{name}/{trial}"
                        gamedata = {"pddl_domain": domain,
                                    "grammar": grammar.replace("UNKNOWN GOAL", task_sentence(rng, task)),
                                    "pddl_problem": problem_text(room, task, f"plan_{room.name}_{i}"),
                                    "solvable": None, "walkthrough": None}
                        plan = planner.solve(gamedata, planning_problem(room, task, f"plan_{room.name}_{i}"))
                        if plan is None:
                            continue
                        gamedata.update(solvable=True, walkthrough=plan)
                        _write_json(out / game_id / GAME_FILE, gamedata)
                        _write_json(out / game_id / TRAJ_FILE, {
                            "task_id": f"{name}/{trial}", "task_type": task_type,
                            "pddl_params": {"object_target": task.object_target,
                                            "parent_target": task.parent_target,
                                            "toggle_target": task.toggle_target, "mrecep_target": "",
                                            "object_sliced": False},
                            "scene": {"floor_plan": room.name, "room_type": room.kind,
                                      "layout_fingerprint": room.fingerprint()},
                            "turk_annotations": {"anns": []},
                            "swerl": {"generator_version": GENERATOR_VERSION, "seed": seed}})
                        games.append(GeneratedGame(game_id, split, task_type, room.name, len(plan)))
                        splits[split].append(game_id)
                        if log:
                            log(f"{game_id}: plan of {len(plan)} steps")
                        break
                    else:
                        raise RuntimeError(f"no solvable {task_type} game found in {MAX_ATTEMPTS} tries for "
                                           f"{split} game {i} (seed {seed}); try another seed")
    finally:
        planner.close()
    _write_json(out / SPLITS_FILE, {k: sorted(v) for k, v in splits.items()})
    return games
