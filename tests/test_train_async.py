"""Async training (`async.max_staleness`, `async.partial_rollouts`; swerl/asyncrl.py): 0 is the synchronous
loop (against metrics and final weights recorded from the loop before async existed, tests/golden/: the
same trajectories and every count exactly, floats and weights within what another CPU vendor's float32
kernels change), k >= 1 overlaps rollouts with learning and never trains on anything staler than k,
partial rollouts continue episodes on new weights with each turn's own version, and bad settings fail
before the run starts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from swerl.asyncrl import AheadRollouts, AsyncConfig, BackgroundLoop, Group, check_engine, staleness
from swerl.config import ConfigError, help_text, load
from swerl.structs import Generation, SamplingParams, Trajectory
from swerl.train import TrainConfig, train

TOY = "configs/toy_cpu.yaml"
GOLDEN = Path(__file__).parent / "golden"
# wall-clock numbers differ from run to run; everything else must be equal
_CLOCK = ("timing_s/", "actor/tokens_per_s", "rollout/engine_s_mean", "rollout/env_s_mean")


# The goldens were recorded on one x86 vendor; another's float32 kernels (MKL and oneDNN pick AVX-512 on
# Intel, AVX2 on AMD) add the same terms in another order. What must be equal is everything discrete (ints,
# bools: counts, tokens, steps) and, through them, the sampled trajectories. A float may differ by the
# rounding of reordered sums: one sum of n float32 terms by at most gamma_n = n*u/(1 - n*u) times the sum of
# the terms' magnitudes (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Lemma 3.1),
# u = 2^-24. The tolerance takes gamma_n for the longest sum in the run (the vocabulary's log-softmax, the
# hidden and MLP widths, the tokens of a batch), relative to the value and, for values that cancel to about
# 0 from terms of order 1 (advantage_mean, approx_kl), absolute. That is not a proof over every layer and
# step the errors compound through: it is the margin, and Intel against AMD over these runs differ by at
# most 4u relative, far inside it (n >= 180 here).
U = 2.0 ** -24


def _rtol(model: torch.nn.Module, golden_rows: list[dict]) -> float:
    c = model.config
    n = max(c.vocab_size, c.hidden_size, c.intermediate_size, *(r["actor/tokens"] for r in golden_rows))
    return n * U / (1 - n * U)


def _close(want: object, got: object, rtol: float) -> bool:
    if not isinstance(want, float):  # ints, bools, strings: exactly
        return want == got and type(want) is type(got)
    if not isinstance(got, float):
        return False
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return abs(want - got) <= rtol * (abs(want) + 1)


def _update_stats(start_model: torch.nn.Module, run_dir: Path) -> dict[str, tuple[float, float, int]]:
    """Per tensor of the final policy, in float64: the norm of what training changed (final - initial) and
    its projection on a fixed random direction (which a sign error would flip)."""
    from safetensors.torch import load_file

    start = start_model.state_dict()
    final: dict[str, torch.Tensor] = {}
    for f in sorted((run_dir / "policy").glob("*.safetensors")):
        final.update(load_file(f))
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name in sorted(final):
        delta = final[name].double() - start[name].double()
        direction = torch.randn(delta.shape, generator=gen, dtype=torch.float64)
        out[name] = (delta.norm().item(), (delta * direction).sum().item(), delta.numel())
    return out


def _check_against_golden(tmp_path: Path, name: str) -> None:
    golden = json.loads((GOLDEN / f"sync_loop_{name}.json").read_text())
    cfg = load(TrainConfig, golden["config"], [f"run_dir={tmp_path}", *golden["overrides"],
                                               "async.max_staleness=0"])
    rows = train(cfg, log=None)
    assert len(rows) == len(golden["rows"])
    from swerl.train import _load_policy

    init = tmp_path / "init_model"
    start_model = _load_policy(cfg, str(init) if init.is_dir() else None, torch.float32)
    rtol = _rtol(start_model, golden["rows"])
    for want, got in zip(golden["rows"], rows, strict=True):
        want = {k: (math.nan if v is None else v) for k, v in want.items()}
        diffs = {k: (v, got.get(k)) for k, v in want.items()
                 if not k.startswith(_CLOCK) and not _close(v, got.get(k), rtol)}
        assert not diffs, (want["train_step"], rtol, diffs)
        assert not [k for k in got if k.startswith("async/")]  # the synchronous loop has no producer
    # The weights: AdamW moves an element by at most lr * max(1, (1 - b1) / sqrt(1 - b2)) an optimizer step
    # (Kingma & Ba, section 2.1), and rounding in the gradients changes that move by a small fraction of
    # it: 1e-3 here, 1e4 times the relative gradient differences measured between vendors (about 1e-7)
    # for cancellation in small gradients, and 1e3 times below the change a different loop makes (a step
    # of its own, O(1) of the move). Summed over the steps that bounds an element's difference e; a
    # tensor's update norm then differs by at most sqrt(numel) * e, and its projection on a fixed random
    # direction, independent of the rounding, by about the error's norm: 6 of them bound it.
    b1, b2 = cfg.optim.betas
    steps = sum(r["actor/optimizer_steps"] for r in rows)
    per_element = steps * cfg.optim.lr * max(1.0, (1 - b1) / math.sqrt(1 - b2)) * 1e-3
    stats = _update_stats(start_model, tmp_path)
    assert set(stats) == set(golden["weights_update"])
    for tensor, (norm, proj, numel) in golden["weights_update"].items():
        got_norm, got_proj, got_numel = stats[tensor]
        assert got_numel == numel, tensor
        assert abs(got_norm - norm) <= math.sqrt(numel) * per_element, (tensor, norm, got_norm)
        assert abs(got_proj - proj) <= 6 * math.sqrt(numel) * per_element, (tensor, proj, got_proj)


def test_max_staleness_0_is_the_synchronous_loop_on_the_toy_game(tmp_path):
    _check_against_golden(tmp_path, "toy")


@pytest.mark.docker
@pytest.mark.slow
def test_max_staleness_0_is_the_synchronous_loop_on_the_swe_debug_config(tmp_path):
    _check_against_golden(tmp_path, "swe")


def _toy(tmp_path: Path, *extra: str) -> list[dict]:
    return train(load(TrainConfig, TOY, [f"run_dir={tmp_path}", "steps=5", "batch_episodes=16",
                                         "checkpoint_every=0", "export_final=false", "eval_every=0",
                                         "metrics.progress=false", *extra]), log=None)


@pytest.mark.parametrize("k", [1, 2])
def test_rollouts_run_ahead_by_at_most_k_steps(tmp_path, k):
    rows = _toy(tmp_path, f"async.max_staleness={k}")
    assert [r["train_step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        hist = [r[f"async/staleness_{s}"] for s in range(k + 1)]
        assert sum(hist) == r["rollout/episodes_trained"] == 16 and r["async/staleness_max"] <= k
        assert r["async/dropped_stale"] == 0 and r["async/partial_episodes"] == 0  # no partial rollouts
    # step 1 is on the initial weights; after it the producer keeps k steps ahead: each step trains on
    # rollouts of the weights min(k, step - 1) steps older
    assert [r["async/staleness_mean"] for r in rows] == [min(k, s) for s in range(5)]
    assert rows[0]["timing_s/rollout"] > 0 and all(r["timing_s/rollout"] < rows[0]["timing_s/rollout"]
                                                  for r in rows[2:])  # ready before they are asked for
    doc = Path("docs/metrics.md").read_text()
    assert all(f"`{key}`" in doc or (key.startswith("async/staleness_") and "`async/staleness_<i>`" in doc)
               for key in rows[-1] if key.startswith("async/"))
    saved = load(TrainConfig, tmp_path / "config.yaml")  # written under the YAML key `async`, read back
    assert saved.async_ == AsyncConfig(max_staleness=k)
    assert "async:" in (tmp_path / "config.yaml").read_text()


def test_partial_rollouts_on_the_toy_game_train_within_the_bound(tmp_path):
    # whether an update lands inside an episode depends on timing here; the producer tests below pin it
    rows = _toy(tmp_path, "async.max_staleness=2", "async.partial_rollouts=true", "steps=6")
    for r in rows:
        assert r["async/staleness_max"] <= 2
        assert sum(r[f"async/staleness_{s}"] for s in range(3)) == r["rollout/episodes_trained"]


def test_async_with_the_off_policy_correction_learns_and_resumes(tmp_path):
    common = ["async.max_staleness=1", "algo.recompute_old_logp=true", "algo.rollout_is.mode=truncate"]
    rows = _toy(tmp_path / "a", *common, "steps=3", "checkpoint_every=2", "eval_every=3", "eval.k=2")
    assert all(not math.isnan(r["actor/is_ratio_mean"]) for r in rows)  # the correction saw the stale data
    assert rows[-1]["val/episodes"] == 6  # evaluation has the engine to itself meanwhile
    assert rows[1]["actor/mismatch_kl_k3"] > 0  # one step stale: the learner's log-probs differ
    more = _toy(tmp_path / "a", *common, "steps=4", "checkpoint_every=2")  # resumes at its step-3 checkpoint
    assert [r["train_step"] for r in more] == [4] and more[0]["async/staleness_mean"] == 0


@pytest.mark.docker
@pytest.mark.slow
def test_async_partial_rollouts_on_the_swe_debug_config(tmp_path):
    # 4 episodes at once: the two groups of a step run side by side, each with sandbox pools of its own
    cfg = load(TrainConfig, "configs/debug_cpu.yaml", [
        f"run_dir={tmp_path}", "steps=2", "checkpoint_every=0", "export_final=false", "eval_every=0",
        "rollout.max_new_tokens=16", "rollout.max_turns=2", "rollout.max_episodes=4",
        "metrics.progress=false", "async.max_staleness=1", "async.partial_rollouts=true"])
    rows = train(cfg, log=None)
    assert [r["train_step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/episodes_run"] == 4 and r["rollout/episodes_failed"] == 0
        assert sum(r[f"async/staleness_{s}"] for s in (0, 1)) == r["rollout/episodes_trained"] == 4
    logged = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(logged) >= 8
    for d in logged:  # every turn says which weights produced it
        t = d["trajectory"]
        assert t["turn_versions"] == [turn["weight_version"] for turn in t["turns"]] and t["turn_versions"]


# ---- the producer on its own, with a play function the test controls -------------------------------


class _Echo:
    """An engine whose generations are one token, the prompt's length."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        await asyncio.sleep(0)
        return Generation(token_ids=(len(prompt_ids),), logprobs=(0.0,), finish_reason="stop")


def _traj(versions: list[int]) -> Trajectory:
    n = len(versions)
    return Trajectory(token_ids=(0,) * (n + 1), loss_mask=(0,) + (1,) * n, span=(0,) + (1,) * n,
                      logprobs=(0.0,) * (n + 1), turn_index=(-1, *range(n)), prompt_len=1, terminated=True,
                      truncated=False, stop_reason="x", reward=1.0, turn_versions=tuple(versions))


def test_a_straggler_staler_than_k_is_dropped_counted_and_replaced():
    released = {}

    async def play(engine, step):
        gen = await engine.generate([1, 2], SamplingParams())
        if step == 1 and "slow" not in released:  # the first group of step 1 is a long-tail episode
            released["slow"] = asyncio.Event()
            await released["slow"].wait()
        return Group((_traj([gen.weight_version]), _traj([gen.weight_version])))

    cfg = AsyncConfig(max_staleness=1, partial_rollouts=True)
    with (BackgroundLoop() as loop,
          AheadRollouts(loop, _Echo(), play, cfg, tasks_per_step=2, version=0) as ahead):
        b1 = ahead.batch(1)  # the straggler holds no slot: the step takes the first two groups to finish
        assert b1.metrics["async/staleness_0"] == 4 and b1.metrics["async/dropped_stale"] == 0
        for step in (1, 2):
            with ahead.weight_update(step):
                pass
        loop.run(asyncio.sleep(0.05))
        loop._loop.call_soon_threadsafe(released["slow"].set)  # type: ignore[union-attr]
        b3 = ahead.batch(3)  # trained on version 2: the version-0 straggler is 2 stale > k, dropped
        assert b3.metrics["async/dropped_stale"] == 2 and b3.metrics["async/dropped_stale_groups"] == 1
        assert b3.metrics["async/staleness_max"] <= 1 and len(b3.trajectories) == 4
        assert all(staleness(t, 2) <= 1 for t in b3.trajectories)


@pytest.mark.parametrize("partial", [True, False])
def test_at_a_weight_update_episodes_continue_on_new_weights_only_with_partial_rollouts(partial):
    between, finished = threading.Event(), []
    released = asyncio.Event()

    async def play(engine, step):
        if step >= 3:  # groups started after the update never finish: only the first two are looked at
            await asyncio.Event().wait()
        versions = [(await engine.generate([1], SamplingParams())).weight_version]
        if step == 1:  # the long episode: the update comes while it is between its two turns
            between.set()
            if partial:  # held until the update is in place (an update that waited for it: 30 s, then fails)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(released.wait(), 30)
            else:  # an update that did not wait for it would find it unfinished
                await asyncio.sleep(0.3)
        versions.append((await engine.generate([1, 2], SamplingParams())).weight_version)
        finished.append(step)
        return Group((_traj(versions),))

    cfg = AsyncConfig(max_staleness=1, partial_rollouts=partial)
    with (BackgroundLoop() as loop,
          AheadRollouts(loop, _Echo(), play, cfg, tasks_per_step=1, version=0) as ahead):
        assert between.wait(30)
        with ahead.weight_update(1):
            long_done = 1 in finished
            loop._loop.call_soon_threadsafe(released.set)  # type: ignore[union-attr]
        b1, b2 = ahead.batch(1), ahead.batch(2)
    assert b1.trajectories[0].turn_versions == (0, 0)  # the short episode, done before the update
    long = b2.trajectories[0].turn_versions
    if partial:  # the update did not wait: the long episode's second turn ran on version 1
        assert long == (0, 1) and b2.metrics["async/partial_episodes"] == 1 and not long_done
    else:  # the update waited for the running episode, which finished on the weights it started with
        assert long == (0, 0) and b2.metrics["async/partial_episodes"] == 0 and long_done
    assert b2.metrics["async/staleness_1"] == 1  # trained at step 2, on version 1


def _until(loop: BackgroundLoop, cond, timeout_s: float = 30.0) -> None:
    """Wait until `cond()` holds (the producer works on the loop's thread; a loaded machine may take a
    while), then 0.1 s more, in which anything that should not come would."""
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        loop.run(asyncio.sleep(0.01))
    loop.run(asyncio.sleep(0.1))


def test_the_producer_never_starts_more_than_k_steps_ahead():
    started = []

    async def play(engine, step):
        started.append((step, engine.version))
        gen = await engine.generate([1], SamplingParams())
        return Group((_traj([gen.weight_version]),))

    with BackgroundLoop() as loop, AheadRollouts(loop, _Echo(), play, AsyncConfig(max_staleness=1),
                                                 tasks_per_step=3, version=0) as ahead:
        ahead.batch(1)
        _until(loop, lambda: len(started) >= 6)
        # version 0: groups for steps 1 and 2 only (3 each), whatever the learner is doing
        assert sorted(started) == [(1, 0)] * 3 + [(2, 0)] * 3
        with ahead.weight_update(1):
            pass
        _until(loop, lambda: len(started) >= 9)
        assert sorted(started)[6:] == [(3, 1)] * 3


def test_a_failing_episode_fails_the_run_at_the_next_batch():
    async def play(engine, step):
        raise RuntimeError("the engine is gone")

    with (BackgroundLoop() as loop,
          AheadRollouts(loop, _Echo(), play, AsyncConfig(max_staleness=1), tasks_per_step=1,
                        version=0) as ahead,
          pytest.raises(RuntimeError, match="the engine is gone")):
        ahead.batch(1)


# ---- bad input -----------------------------------------------------------------------------------


def test_bad_async_settings_fail_before_the_run_with_the_setting_named():
    with pytest.raises(ConfigError, match=r"async\.max_staleness must be >= 0"):
        load(TrainConfig, TOY, ["async.max_staleness=-1"])
    with pytest.raises(ConfigError, match=r"async\.partial_rollouts needs async\.max_staleness >= 1"):
        load(TrainConfig, TOY, ["async.partial_rollouts=true"])
    with pytest.raises(ValueError, match=r"async\.partial_rollouts .*rollout\.engine other cannot") as e:
        check_engine(AsyncConfig(max_staleness=1, partial_rollouts=True), "other")  # no such engine yet
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) async\.max_stalenes.*max_staleness"):
        load(TrainConfig, TOY, ["async.max_stalenes=1"])
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) async_;"):
        load(TrainConfig, TOY, ["async_.max_staleness=1"])  # the attribute name is no YAML key
    assert load(TrainConfig, TOY, ["async.max_staleness=2"]).async_.max_staleness == 2
    keys = {key: doc for key, _, doc in help_text(TrainConfig)}
    assert "async.partial_rollouts" in keys and "0 is the synchronous" in keys["async.max_staleness"]


@pytest.mark.parametrize("engine", ["hf", "sglang", "vllm"])
def test_partial_rollouts_are_accepted_on_every_engine_that_can_pause(engine):
    """vLLM pauses with /pause?mode=keep and /resume (`VLLMEngine.pause_generation`), SGLang with
    /pause_generation retract, hf in process: `partial_rollouts: true` passes the config checks on each."""
    cfg = load(TrainConfig, "configs/debug_cpu.yaml", [f"rollout.engine={engine}", "async.max_staleness=1",
                                                      "async.partial_rollouts=true"])
    assert cfg.rollout.engine == engine and cfg.async_.partial_rollouts
