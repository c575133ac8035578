"""The fleet's dispatcher on hand-worked cases (no Ray, no Docker): spread, image locality, turns, lost
and returning hosts; and the cluster config's refusals."""

from __future__ import annotations

import pytest

from swerl.cluster.config import ClusterConfig, HostConfig
from swerl.cluster.host import auto_capacity
from swerl.cluster.schedule import NoHostLeft, Scheduler
from swerl.structs import SandboxSpec


def test_equal_hosts_take_turns_and_fill_evenly():
    s = Scheduler()
    s.add("a", 2)
    s.add("b", 2)
    # free (a, b): (2, 2) → a [first picked never: tie on turns, then the order added]; (1, 2) → b; (1, 1) → a
    # (its turn came first); (0, 1) → b; then full
    assert [s.pick() for _ in range(5)] == ["a", "b", "a", "b", None]
    s.done("a")
    assert s.pick() == "a"


def test_the_image_draws_its_episodes_until_the_holder_is_a_bonus_fuller():
    s = Scheduler(locality_bonus=1)
    s.add("a", 4, {"img"})
    s.add("b", 4)
    # scores: a = free + 1, b = free. (5 vs 4) → a; (4 vs 4) tie → b, picked less recently; (4 vs 3) → a;
    # (3 vs 3) → b ... so with bonus 1 the holder leads by one episode at most
    assert [s.pick("img") for _ in range(4)] == ["a", "b", "a", "b"]
    s2 = Scheduler(locality_bonus=3)
    s2.add("a", 4, {"img"})
    s2.add("b", 4)
    # a = free + 3 beats b = 4 until a has 1 free (1 + 3 = 4 ties, b was never picked: b)
    assert [s2.pick("img") for _ in range(4)] == ["a", "a", "a", "b"]
    s2.has_image("b", "img")
    assert s2.pick("img") == "b"  # b: 3 + 3 > a: 1 + 3


def test_a_lost_host_gets_nothing_until_it_is_back_with_empty_slots():
    s = Scheduler()
    s.add("a", 1)
    s.add("b", 1)
    assert {s.pick(), s.pick()} == {"a", "b"}
    s.down("b")
    s.done("b")  # the episode it ran ends (requeued): nothing to give back
    s.done("a")
    assert s.pick() == "a" and s.pick() is None
    s.add("b", 1)  # back: its slot is free, whatever it ran before
    assert s.pick() == "b"
    s.down("a")
    s.down("b")
    with pytest.raises(NoHostLeft):
        s.pick()
    with pytest.raises(NoHostLeft):
        Scheduler().pick()


def test_capacity_follows_cores_and_memory_of_the_sandbox_spec():
    gib = 1024**3
    # 16 cores / 1 cpu = 16; 64 GiB / 2 GiB = 32 → 16
    assert auto_capacity(16, 64 * gib, SandboxSpec(cpus=1.0, memory="2g")) == 16
    # 16 cores / 0.5 = 32; 24 GiB / 2 GiB = 12 → 12
    assert auto_capacity(16, 24 * gib, SandboxSpec(cpus=0.5, memory="2g")) == 12
    assert auto_capacity(1, gib, SandboxSpec(cpus=2.0, memory="4g")) == 1  # at least one


def test_cluster_config_refuses_what_cannot_work():
    with pytest.raises(ValueError, match=r"cluster\.backend must be 'local' or 'ray'"):
        ClusterConfig(backend="k8s")
    with pytest.raises(ValueError, match=r"names a host twice: \['a'\]"):
        ClusterConfig(hosts=(HostConfig(name="a"), HostConfig(name="a")))
    with pytest.raises(ValueError, match="it becomes the Ray resource"):
        HostConfig(name="no spaces")
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        HostConfig(name="a", capacity=-1)
    assert not ClusterConfig().enabled and ClusterConfig(backend="ray").enabled
    assert HostConfig(name="gpu-3").resource == "swerl_host_gpu-3"
