"""Warm pool, reaper, signal cleanup, task images and their cache — against the real engine."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox.images import TaskImageRecipe, build_task_image, task_image_tag
from swerl.sandbox.lifecycle import reap
from swerl.sandbox.pool import SandboxPool

pytestmark = pytest.mark.docker
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _containers(client, run_id):
    # the low-level list is one call: the high-level one inspects each container and races removals
    return client.api.containers(all=True, filters={"label": f"swerl.run={run_id}"})


def test_pool_hands_out_warm_sandboxes_and_never_reuses_one(base_image, docker_client):
    run_id = f"pytest-pool-{uuid.uuid4().hex[:6]}"

    async def main():
        async with SandboxPool(SandboxSpec(image=base_image), warm=2, max_containers=3,
                               run_id=run_id) as pool:
            deadline = time.monotonic() + 60  # two container starts, on a loaded 2-core machine too
            while pool.warm < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert pool.warm == 2
            t = time.perf_counter()
            sb = await pool.acquire()
            assert time.perf_counter() - t < 0.05  # already started: no container create on this path
            first_id = sb.id
            sb.run("echo dirty > /testbed/state")
            await pool.release(sb)
            # removed, not reused
            assert not docker_client.containers.list(all=True, filters={"id": first_id})
            seen = set()
            for _ in range(4):
                async with pool.sandbox() as sb2:
                    assert sb2.id != first_id and sb2.id not in seen
                    seen.add(sb2.id)
                    assert sb2.run("cat /testbed/state 2>&1 || echo clean").output.endswith("clean\n")
            assert len(_containers(docker_client, run_id)) <= 3

    asyncio.run(main())
    assert not _containers(docker_client, run_id)


def test_pool_bounds_live_containers(base_image, docker_client):
    run_id = f"pytest-bound-{uuid.uuid4().hex[:6]}"
    peak = 0

    async def episode(pool):
        nonlocal peak
        async with pool.sandbox() as sb:
            peak = max(peak, len(_containers(docker_client, run_id)))
            await asyncio.to_thread(sb.run, "sleep 0.2")

    async def main():
        async with SandboxPool(SandboxSpec(image=base_image), warm=1, max_containers=2, max_starts=2,
                               run_id=run_id) as pool:
            await asyncio.gather(*(episode(pool) for _ in range(6)))
            assert pool.live <= 2

    asyncio.run(main())
    assert 1 <= peak <= 2
    assert not _containers(docker_client, run_id)


def test_pool_replaces_a_warm_sandbox_killed_from_outside(base_image, docker_client):
    async def main():
        async with SandboxPool(SandboxSpec(image=base_image), warm=1, max_containers=2) as pool:
            while pool.warm < 1:
                await asyncio.sleep(0.05)
            victim = pool._warm[0]
            docker_client.api.kill(victim.id)
            await asyncio.sleep(0.3)
            victim._session.alive = False  # what the session notices on its next read
            async with pool.sandbox() as sb:
                assert sb.id != victim.id and sb.run("echo ok").output == "ok\n"

    asyncio.run(main())


_OWNER = """
import sys, time
from swerl.sandbox import DockerSandbox, SandboxSpec
sb = DockerSandbox(SandboxSpec(image=sys.argv[1]), run_id=sys.argv[2]).start()
print(sb.id, flush=True)
time.sleep(120)
"""


def _spawn_owner(base_image, run_id):
    proc = subprocess.Popen([sys.executable, "-c", _OWNER, base_image, run_id], stdout=subprocess.PIPE,
                            text=True)
    cid = proc.stdout.readline().strip()
    assert cid, "owner process failed to start a sandbox"
    return proc, cid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_owner_removes_its_containers(base_image, docker_client, sig):
    run_id = f"pytest-sig-{uuid.uuid4().hex[:6]}"
    proc, cid = _spawn_owner(base_image, run_id)
    assert docker_client.containers.get(cid).status == "running"
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert not _containers(docker_client, run_id)


def test_reap_removes_what_a_killed_run_left_and_spares_live_runs(base_image, docker_client):
    dead_run = f"pytest-dead-{uuid.uuid4().hex[:6]}"
    proc, cid = _spawn_owner(base_image, dead_run)
    proc.kill()  # SIGKILL: no handler runs, the container is orphaned
    proc.wait(timeout=30)
    assert [c["Id"] for c in _containers(docker_client, dead_run)] == [cid]
    with DockerSandbox(SandboxSpec(image=base_image)) as live:
        reaped = reap(client=docker_client)
        assert cid in [r.id for r in reaped]
        assert live.id not in [r.id for r in reaped]
        assert live.run("echo still").output == "still\n"
    assert not _containers(docker_client, dead_run)


def test_an_expired_sandbox_is_reaped_though_its_owner_lives_and_no_other(base_image, docker_client):
    import asyncio

    from swerl.sandbox import lifecycle
    from swerl.sandbox.pool import SandboxPools

    run_id = f"pytest-ttl-{uuid.uuid4().hex[:6]}"

    async def two() -> tuple[DockerSandbox, DockerSandbox]:
        async with SandboxPools(warm=0, max_containers=2, run_id=run_id, ttl_s=3600) as pools:
            kept = await pools.acquire(SandboxSpec(image=base_image))
            labels = kept.container.labels
            # one whose label says it expired a second ago (the label is the whole rule), owner alive
            assert int(labels[lifecycle.LABEL_EXPIRES]) - time.time() == pytest.approx(3600, abs=5)
            old = DockerSandbox(SandboxSpec(image=base_image), run_id=run_id,
                                labels={lifecycle.LABEL_EXPIRES: str(int(time.time()) - 1)}).start()
            try:
                reaped = reap(client=docker_client)
                assert old.id in [r.id for r in reaped] and kept.id not in [r.id for r in reaped]
                assert [r.reason for r in reaped if r.id == old.id] == ["expired"]
                assert kept.run("echo alive").output == "alive\n"
            finally:
                old.close()
                await pools.release(kept)
            return kept, old

    asyncio.run(two())
    assert not _containers(docker_client, run_id)


def test_task_image_has_repo_wheels_and_runs_tests_offline(task_image):
    with DockerSandbox(SandboxSpec(image=task_image)) as sb:
        r = sb.run("python3 -m pytest -q 2>&1 | tail -1")
        assert "1 failed, 2 passed" in r.output  # the demo repo's planted bug
        assert sb.run("git log --format=%s").output == "base\n"
        assert sb.run("whoami").output == "swerl\n"
        stop = sb.container.attrs["Config"].get("StopSignal")
        assert stop == "SIGKILL"


def test_diff_covers_edits_new_and_binary_files(task_image):
    with DockerSandbox(SandboxSpec(image=task_image)) as sb:
        assert sb.base_commit and len(sb.base_commit) == 40
        src = sb.read_text("/testbed/calc/__init__.py")
        sb.write_file("/testbed/calc/__init__.py", src.replace("(len(values) + 1)", "len(values)"))
        sb.write_file("/testbed/calc/new.py", "NEW = 'ü'\n")
        sb.write_file("/testbed/data.bin", bytes(range(256)))
        sb.run("git commit -qam 'agent commits do not move the base'")
        patch = sb.diff()
        assert "-    return sum(values) / (len(values) + 1)\n+    return sum(values) / len(values)\n" in patch
        assert "+++ b/calc/new.py" in patch and "+NEW = 'ü'" in patch
        assert "GIT binary patch" in patch
        # The patch applies to a pristine checkout and reproduces the tree.
        sb.write_file("/tmp/p.diff", patch.encode("utf-8", "surrogateescape"))
        r = sb.run(f"git stash -q -u 2>/dev/null; git checkout -q {sb.base_commit} && git clean -fdq && "
                   "git apply /tmp/p.diff && python3 -m pytest -q 2>&1 | tail -1 && "
                   "python3 -c \"import sys; sys.exit(open('data.bin','rb').read() != bytes(range(256)))\" "
                   "&& echo same")
        assert "3 passed" in r.output and r.output.endswith("same\n")


def test_unchanged_task_image_is_not_rebuilt(docker_client, demo_recipe, task_image):
    image_id = docker_client.images.get(task_image).id
    t = time.perf_counter()
    assert build_task_image(demo_recipe, client=docker_client) == task_image
    assert time.perf_counter() - t < 2.0  # one lookup, no build
    assert docker_client.images.get(task_image).id == image_id


def test_task_image_tag_changes_with_content(tmp_path, demo_wheels):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    recipe = TaskImageRecipe(name="t", repo_dir=repo)
    tag1, _, _ = task_image_tag(recipe)
    assert task_image_tag(recipe)[0] == tag1  # deterministic
    (repo / "a.py").write_text("x = 2\n")
    tag2, _, _ = task_image_tag(recipe)
    assert tag2 != tag1
    tag3, _, _ = task_image_tag(TaskImageRecipe(name="t", repo_dir=repo, setup=("true",)))
    assert tag3 != tag2


def test_task_recipe_validation(tmp_path):
    with pytest.raises(ValueError, match="lowercase"):
        TaskImageRecipe(name="Bad Name", repo_dir=tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        TaskImageRecipe(name="ok", repo_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="wheels_dir"):
        TaskImageRecipe(name="ok", repo_dir=tmp_path, requirements=("pytest",))


def test_prune_images_removes_superseded_tags_and_keeps_what_is_used(base_image, docker_client):
    from swerl.sandbox.images import LABEL_HASH, build_from_files, prune_images

    prefix = f"swerl-prunetest-{uuid.uuid4().hex[:6]}-"

    def build(tag: str, content: str) -> str:
        dockerfile = f"FROM {base_image}\nLABEL {LABEL_HASH}={content} swerl.prunetest={prefix}\n"
        build_from_files(docker_client, tag, dockerfile, [])
        return docker_client.images.get(tag).id

    a_old, a_new = build(f"{prefix}a:1", "a1"), build(f"{prefix}a:2", "a2")
    b_old, b_new = build(f"{prefix}b:1", "b1"), build(f"{prefix}b:2", "b2")
    c_first = build(f"{prefix}c:1", "c1")
    c_again = build(f"{prefix}c:1", "c1-changed")  # the same tag rebuilt: the first image is left untagged
    user = docker_client.containers.create(f"{prefix}b:1", "true")  # a (stopped) container uses b:1
    try:
        would = {p.name for p in prune_images(docker_client, prefix=prefix, dry_run=True)}
        assert f"{prefix}a:1" in would and c_first in would
        assert not would & {f"{prefix}a:2", f"{prefix}b:1", f"{prefix}b:2", f"{prefix}c:1"}
        docker_client.images.get(a_old)  # a dry run removes nothing

        removed = {p.name for p in prune_images(docker_client, prefix=prefix)}
        assert {f"{prefix}a:1", c_first} <= removed
        ids = {img.id for img in docker_client.images.list(filters={"label": f"swerl.prunetest={prefix}"})}
        assert ids == {a_new, b_old, b_new, c_again}  # the newest of each repository, and the one in use
        docker_client.images.get(base_image)  # other repositories are not touched
    finally:
        user.remove(force=True)
        for img in docker_client.images.list(filters={"label": f"swerl.prunetest={prefix}"}):
            docker_client.images.remove(img.id, force=True)
