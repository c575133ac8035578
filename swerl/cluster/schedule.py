"""Where the next episode runs: the fleet's dispatcher, as plain bookkeeping (no Ray, no Docker), so the
benchmark can drive it with thousands of stand-in hosts.

Ray left to itself packs work onto the first node with room; this spreads it explicitly. An episode
goes to a host that is up and has a free slot, the one with the highest score

    free slots + locality   (locality: `locality_bonus` if the host already holds the episode's image)

so an image already on a host draws its episodes there (no copy before they start) until that host is
`locality_bonus` slots fuller than another; ties go to the host picked least recently, so equal hosts
take turns instead of the first name filling up. A host that is down gets nothing until it is added
again; its slots come back empty.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class HostSlots:
    """One host as the dispatcher sees it."""

    name: str
    capacity: int
    images: set[str] = field(default_factory=set)
    running: int = 0
    up: bool = True
    picked_at: int = 0  # the dispatcher's clock when this host was last picked

    @property
    def free(self) -> int:
        return self.capacity - self.running if self.up else 0


class NoHostLeft(RuntimeError):
    """Every host is down (or none was ever added): nothing can run."""


class Scheduler:
    """Slots over hosts; `pick` chooses a host for an episode and takes one of its slots, `done` gives it
    back. Not thread-safe: the fleet calls it from its one event loop."""

    def __init__(self, locality_bonus: int = 1) -> None:
        if locality_bonus < 0:
            raise ValueError(f"locality_bonus must be >= 0, got {locality_bonus}")
        self.locality_bonus = locality_bonus
        self.hosts: dict[str, HostSlots] = {}
        self._clock = itertools.count(1)

    def add(self, name: str, capacity: int, images: set[str] | None = None) -> None:
        """A host joins, or comes back (with its capacity and images as they are now); its slots start
        free."""
        if capacity < 1:
            raise ValueError(f"host {name!r}: capacity must be >= 1, got {capacity}")
        h = self.hosts.setdefault(name, HostSlots(name, capacity))
        if not h.up:  # back from the dead: nothing of what it ran survived
            h.up, h.running = True, 0
        h.capacity, h.images = capacity, set(images or ())

    def down(self, name: str) -> None:
        """The host is lost: nothing goes to it until `add` brings it back; its running count is cleared
        (the episodes it ran are the fleet's to requeue)."""
        h = self.hosts[name]
        h.up, h.running = False, 0

    def has_image(self, name: str, image: str) -> None:
        """The host now holds `image` (it was copied there)."""
        self.hosts[name].images.add(image)

    @property
    def up(self) -> list[str]:
        return [h.name for h in self.hosts.values() if h.up]

    def pick(self, image: str | None = None) -> str | None:
        """The host for an episode of `image` (None: no sandbox), its slot taken; None when every host that
        is up is full. Raises `NoHostLeft` when no host is up."""
        best: HostSlots | None = None
        best_key = (0, 0)
        any_up = False
        for h in self.hosts.values():
            if not h.up:
                continue
            any_up = True
            if h.free <= 0:
                continue
            key = (h.free + (self.locality_bonus if image in h.images else 0), -h.picked_at)
            if best is None or key > best_key:
                best, best_key = h, key
        if not any_up:
            raise NoHostLeft("no sandbox host is up")
        if best is None:
            return None
        best.running += 1
        best.picked_at = next(self._clock)
        return best.name

    def done(self, name: str) -> None:
        """An episode on `name` ended: its slot is free again (a host marked down since has none to give)."""
        h = self.hosts[name]
        if h.up and h.running > 0:
            h.running -= 1
