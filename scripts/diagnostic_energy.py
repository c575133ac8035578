"""ActFocus's diagnostic with a real reference: does the frozen reference's uncertainty about a group's
action tokens track that group's reward variance?

    .venv/bin/python scripts/diagnostic_energy.py        # FrozenLake and Sokoban: SmolLM2 and its warm starts
    .venv/bin/python scripts/diagnostic_energy.py groups=50 envs=[frozenlake] data=[size=3]   # overrides

The warm starts come from `scripts/experiment_credit.py --config configs/experiment/credit_smollm2_cpu.yaml
--warm-start-only envs=[frozenlake,sokoban] 'data=["size=3","dim=5,min_moves=1,max_moves=4"]'`.

For every env:
1. groups: `swerl eval game ENV --model POLICY --k group_size --limit groups --split train` samples
   `group_size` episodes per game from the policy (the games are the groups), in OUT/<env>/samples, with
   the hf engine in process or a vLLM server (`engine`; a rerun resumes: `swerl eval` skips the samples
   already there). An episode that failed for a harness reason has no trajectory and is left out, never
   counted as reward 0; its group keeps the others.
2. energy, under every reference R: R's energy per generated token, E_t = -logsumexp(z_t / T) at the
   sampling temperature T, over each trajectory's own token ids, with the learner's own forward
   (`swerl.learner.backend.sequence_stats`, the pass ActFocus's weights come from in training), each
   episode's kept in OUT/<env>/energy/<R> (a rerun, or a pass run while groups are still being sampled,
   computes only the episodes it has not seen; a retrained R, whose weights differ, is measured again);
   each group's mean over its action tokens and over its reasoning tokens
   (`swerl.algo.diagnostics.group_energies`), against the population variance of its episode rewards.
3. the correlation across groups, Pearson with a 95% Fisher-z interval and Spearman, for action and for
   reasoning tokens, per reference; OUT/diagnostic_energy.json (also `bench_out`) and a table.

As in training, the groups come from the policy and the reference is frozen: by default the policy is
the env's warm start (`swerl sft` of scripts/experiment_credit.py) and the references are the pretrained
model itself and that warm start. The pretrained model cannot be the policy of a useful diagnostic: on
FrozenLake 92% of its turns are malformed and it wins no game, so no group has any reward variance.
The paper (ActFocus, arXiv 2605.14558) reports rho ~ +0.54 for action tokens and ~ 0 for reasoning
tokens. `{env}` in a model path is replaced by the env's name.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swerl.algo.diagnostics import correlation_ci, energy_reward_correlation  # noqa: E402
from swerl.config import load  # noqa: E402
from swerl.files import atomic_write, sha256_file  # noqa: E402


@dataclass(frozen=True)
class DiagnosticConfig:
    """The energy-reward-variance diagnostic (YAML + key=value overrides; defaults: SmolLM2 on 2 cores)."""

    out: str = "runs/diagnostic_energy"
    """Output directory: the sampled groups (swerl eval folders) and the summary JSON."""
    envs: tuple[str, ...] = ("frozenlake", "sokoban")
    """Text-game kinds (swerl.envs.registry)."""
    data: tuple[str, ...] = ("size=3", "dim=5,min_moves=1,max_moves=4")
    """Generator options per env (swerl eval's --game-data), aligned with envs; '' for the defaults."""
    policy: str = "runs/experiment_credit_smollm2/{env}/warm/model"
    """The model the groups are sampled from: a shipped name (swerl models list) or a directory."""
    references: tuple[str, ...] = ("smollm2-135m-instruct", "runs/experiment_credit_smollm2/{env}/warm/model")
    """Frozen reference models whose energy is measured on the policy's groups (names or directories)."""
    groups: int = 200
    """Rollout groups (games of the train split) per env."""
    group_size: int = 8
    """Episodes per group, sampled from the policy."""
    temperature: float = 1.0
    """Sampling temperature; the energy is taken at the same temperature, as the learner does. At 0.7 the
    warm start's groups mostly repeat one play (entropy ~0.005 nats per token), so few groups have any
    reward variance; 1.0 is what the SmolLM2 RL config samples at."""
    max_turns: int = 6
    """Turn budget of every episode (the game's step budget)."""
    max_new_tokens: int = 128
    """Token budget of one model turn."""
    workers: int = 32
    """Episodes sampled concurrently (the hf engine batches up to 64)."""
    engine: str = "hf"
    """What samples the groups: `hf` (in process) or `vllm` (the server at engine_url, serving the policy).
    With many long episodes at once the hf engine's batch-wide KV cache is padded to its longest row and
    copied whenever a row leaves or joins; vLLM's paged cache is not: on these games, 64 episodes at
    once, vLLM generated ~4x the hf engine's tokens/s on 2 cores (README)."""
    engine_url: str = ""
    """engine=vllm: the server's URL, e.g. one started with `VLLM_CPU_KVCACHE_SPACE=4
    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model POLICY --served-model-name policy
    --dtype float32 --port 8123 --generation-config vllm --logprobs-mode processed_logprobs`
    (scripts/vllm_cpu_env.sh makes .venv-vllm). It must serve the env's policy (checked), so with
    several envs and this engine, run one env at a time, each with a server on its own policy."""
    continuous: bool = True
    """hf: the engine batches continuously (`swerl eval game --continuous`): an episode's turn does not wait
    for the batch's longest row (~2x the generated tokens/s on these games, scripts/bench_hf_engine.py);
    false: static batches, so a rerun samples the same episodes exactly."""
    threads: int = 2
    """Torch threads (OMP_NUM_THREADS) of the sampling and energy passes."""
    micro_batch_tokens: int = 8192
    """Padded tokens per forward of the energy pass."""
    seed: int = 0
    """Sampling seed."""
    bench_out: str = "bench_out/diagnostic_energy.json"
    """Also write the summary JSON here, relative to the repository (empty: only OUT's copy)."""

    def __post_init__(self) -> None:
        from swerl.envs.registry import game_kind_names

        bad = [e for e in self.envs if e not in game_kind_names()]
        if bad:
            raise ValueError(f"envs: {bad} are not text-game kinds; choose from {game_kind_names()}")
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"engine must be hf or vllm, got {self.engine!r}")
        if (self.engine == "vllm") != bool(self.engine_url):
            raise ValueError("engine_url goes with engine=vllm, and engine=vllm needs one (the server "
                             "serving the policy; see --help)")
        if len(self.data) != len(self.envs):
            raise ValueError(f"data needs one entry per env ({len(self.envs)}), got {len(self.data)}")
        if not self.references:
            raise ValueError("references: at least one model")
        for name in ("groups", "max_turns", "max_new_tokens", "workers", "threads", "micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: a reward variance needs at least two episodes")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (groups are sampled), got {self.temperature}")


@dataclass(frozen=True)
class GroupStat:
    """One rollout group: its mean reference energy over action and over reasoning tokens (NaN where it
    has none), its episodes' rewards and their population variance."""

    game: str
    action_energy: float
    reasoning_energy: float
    rewards: tuple[float, ...]
    reward_var: float


def ref_label(ref: str) -> str:
    """A short name of a reference for folders and tables."""
    p = Path(ref)
    return "warm_start" if p.name == "model" and p.parent.name == "warm" else p.name


def eval_command(cfg: DiagnosticConfig, env: str, data: str, model: str, out: Path) -> list[str]:
    """The `swerl eval game` command line that samples `env`'s groups from `model` into `out`."""
    cmd = [sys.executable, "-m", "swerl", "eval", "game", env, "--model", model, "--split", "train",
           "--k", str(cfg.group_size), "--limit", str(cfg.groups), "--temperature", str(cfg.temperature),
           "--max-new-tokens", str(cfg.max_new_tokens), "--max-steps", str(cfg.max_turns),
           "--workers", str(cfg.workers), "--seed", str(cfg.seed), "--in-process", "--quiet",
           "--out", str(out)]
    if cfg.engine != "hf":
        cmd += ["--engine", cfg.engine, "--engine-url", cfg.engine_url]
    elif cfg.continuous:
        cmd.append("--continuous")
    if data:
        cmd += ["--game-data", data]
    return cmd


def check_served_model(url: str, model: str) -> None:
    """The server at `url` must serve `model` (its /v1/models `root`: the same directory, or the same
    weights): groups sampled from another env's policy would be measured as this one's. A server not
    up yet is left to `swerl eval`, which waits for it."""
    import httpx

    try:
        served = httpx.get(url.rstrip("/") + "/v1/models", timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return
    roots = [str(m.get("root") or m.get("id")) for m in served]

    def same(root: str) -> bool:
        path = Path(root) if Path(root).is_absolute() else ROOT / root
        return path.resolve() == Path(model).resolve() or (
            path.is_dir() and weights_digest(str(path)) == weights_digest(model))
    if not any(same(r) for r in roots):
        raise RuntimeError(f"the server at {url} serves {', '.join(roots)}, not this env's policy {model}: "
                           "start one on the policy (see --help, engine_url)")


def sample_groups(cfg: DiagnosticConfig, env: str, data: str, model: str, out: Path) -> None:
    """`swerl eval game` with k = group_size samples per game, into `out` (resumes; not started at all
    when every episode is there, so that a finished env needs no engine)."""
    if len(list((out / "trajectories").glob("*.json"))) >= cfg.groups * cfg.group_size:
        return
    if cfg.engine != "hf":
        check_served_model(cfg.engine_url, model)
    cmd = eval_command(cfg, env, data, model, out)
    env_vars = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(ROOT)}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "eval.log", "a") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env_vars, cwd=ROOT)
    if code:
        tail = (out / "eval.log").read_text().strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"sampling {env} from {model} failed (exit {code}): {tail[0]} "
                           f"(log: {out / 'eval.log'})")


def load_groups(samples: Path) -> tuple[list[Any], list[int], list[str], list[str]]:
    """The trajectories under `samples/trajectories` (each `<game>__<k>.json`), their group numbers, the
    groups' game ids (in sorted order) and the trajectories' names (`<game>__<k>`)."""
    from swerl.structs import Trajectory

    files = sorted((samples / "trajectories").glob("*.json"))
    games = sorted({f.stem.rsplit("__", 1)[0] for f in files})
    index = {g: i for i, g in enumerate(games)}
    trajs = [Trajectory.from_json(f.read_text()) for f in files]
    return trajs, [index[f.stem.rsplit("__", 1)[0]] for f in files], games, [f.stem for f in files]


def episode_energies(model: Any, trajectories: Sequence[Any], *, temperature: float,
                     micro_batch_tokens: int) -> list[list[float]]:
    """Each trajectory's energies under `model` at its generated tokens (in order): entry j is the j-th
    token with loss_mask 1, E = -logsumexp(z / T) of the logits it was sampled from."""
    import torch

    from swerl.learner.backend import loss_positions, sequence_stats, shared_prefix
    from swerl.learner.batch import collate, pack_micro_batches

    batch = collate(trajectories, list(range(len(trajectories))))
    out: list[list[float]] = [[] for _ in trajectories]
    with torch.no_grad():
        for rows in pack_micro_batches(batch.lengths, micro_batch_tokens):
            mb = batch.select(rows)
            where = loss_positions(mb)  # the head at generated tokens, as the learner
            # the rows' common start (at least the system prompt, ~22% of a FrozenLake episode) fed once
            s = sequence_stats(model, mb, chunk_size=1024, temperature=temperature, compute_entropy=False,
                               where=where, prefix=shared_prefix(mb, where))
            for j, i in enumerate(rows):
                out[i] = s.energy[j][where[j]].double().tolist()
    return out


def group_stats(energies: Sequence[Sequence[float]], trajectories: Sequence[Any], groups: Sequence[int],
                games: Sequence[str]) -> list[GroupStat]:
    """Each group's mean action / reasoning energy (from `episode_energies`) and its reward variance."""
    import torch

    from swerl.algo.diagnostics import group_energies
    from swerl.learner.batch import collate
    from swerl.structs import Span

    batch = collate(trajectories, groups)
    k, width = batch.input_ids.shape
    # entry t is about token t + 1 (predicted from position t), as in the learner
    mask = batch.loss_mask[:, 1:].bool()
    energy = torch.zeros(k, width - 1, dtype=torch.float64)
    for i, e in enumerate(energies):
        energy[i, mask[i]] = torch.tensor(e, dtype=torch.float64)
    span = batch.span[:, 1:]
    g = group_energies(energy, mask & (span == Span.ACTION), mask & (span == Span.REASONING),
                       batch.rewards.double(), batch.group)
    # group_energies lists groups in order of first appearance; collate kept the trajectories' order
    order = list(dict.fromkeys(int(x) for x in batch.group))
    out = []
    for j, gi in enumerate(order):
        rewards = tuple(float(batch.rewards[i]) for i in range(k) if int(batch.group[i]) == gi)
        out.append(GroupStat(games[gi], g.action[j], g.reasoning[j], rewards, g.reward_var[j]))
    return out


def weights_digest(model_dir: str) -> str:
    """sha256 over the directory's weight files (names and bytes): energies kept under a reference are
    read back only while its weights are the ones they were computed with, not after a retrain into the
    same path."""
    files = sorted(Path(model_dir).glob("*.safetensors")) + sorted(Path(model_dir).glob("*.bin"))
    if not files:
        raise RuntimeError(f"{model_dir}: no weight files (*.safetensors or *.bin); is it a model directory?")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        h.update(bytes.fromhex(sha256_file(f)))
    return h.hexdigest()


def cached_energies(reference: str, trajectories: Sequence[Any], names: Sequence[str], cache: Path, *,
                    temperature: float, micro_batch_tokens: int, threads: int) -> list[list[float]]:
    """`episode_energies` under `reference`, each episode's kept in `cache`/<name>.json: a rerun, or a
    pass over groups still being sampled, computes only the episodes it has not seen. The key holds the
    reference's path, its weights' digest and the temperature."""
    key = {"reference": reference, "weights": weights_digest(reference), "temperature": temperature}
    out: list[list[float] | None] = []
    for t, name in zip(trajectories, names, strict=True):
        f = cache / f"{name}.json"
        kept = json.loads(f.read_text()) if f.is_file() else {}
        ok = kept.get("key") == key and kept.get("tokens") == len(t.token_ids)
        out.append(kept["energy"] if ok else None)
    todo = [i for i, e in enumerate(out) if e is None]
    if todo:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        model = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
        step = 256  # episodes per save: an interrupted pass keeps what it finished
        for lo in range(0, len(todo), step):
            part = todo[lo:lo + step]
            for i, e in zip(part, episode_energies(model, [trajectories[i] for i in part],
                                                   temperature=temperature,
                                                   micro_batch_tokens=micro_batch_tokens), strict=True):
                out[i] = e
                _write_json(cache / f"{names[i]}.json", {"key": key, "tokens": len(trajectories[i].token_ids),
                                                         "energy": e})
    return [e for e in out if e is not None]


def _corr(e: Sequence[float], v: Sequence[float]) -> dict[str, Any]:
    n = sum(math.isfinite(a) and math.isfinite(b) for a, b in zip(e, v, strict=True))
    pearson, spearman = energy_reward_correlation(e, v)
    lo, hi = correlation_ci(pearson, n)
    return {"pearson": pearson, "ci95": [lo, hi], "spearman": spearman, "groups": n}


def correlations(stats: Sequence[GroupStat]) -> dict[str, Any]:
    """Pearson (95% Fisher-z interval) and Spearman across groups, per token kind: energy against reward
    variance (the paper's diagnostic), the same over the groups whose rewards vary only, and energy
    against the group's mean reward (how hard the game was for the policy)."""
    out: dict[str, Any] = {}
    varying = [s for s in stats if s.reward_var > 0]
    for kind in ("action", "reasoning"):
        e = [getattr(s, f"{kind}_energy") for s in stats]
        out[kind] = _corr(e, [s.reward_var for s in stats])
        out[kind]["varying_groups_only"] = _corr([getattr(s, f"{kind}_energy") for s in varying],
                                                 [s.reward_var for s in varying])
        out[kind]["vs_mean_reward"] = _corr(e, [statistics.fmean(s.rewards) for s in stats])
    return out


def summarise(stats: Sequence[GroupStat], trajectories: Sequence[Any]) -> dict[str, Any]:
    """What the report says about one (env, reference): group counts, success, token shares, correlations."""
    from swerl.structs import Span

    rewards = [r for s in stats for r in s.rewards]
    gen = sum(sum(t.loss_mask) for t in trajectories)
    act = sum(sum(m and s == Span.ACTION for m, s in zip(t.loss_mask, t.span, strict=True))
              for t in trajectories)
    finite = [s.action_energy for s in stats if math.isfinite(s.action_energy)]
    return {"groups": len(stats), "episodes": len(rewards),
            "groups_with_reward_variance": sum(s.reward_var > 0 for s in stats),
            "success_rate": statistics.fmean(r > 0 for r in rewards) if rewards else math.nan,
            "action_token_share": act / gen if gen else math.nan,
            "mean_action_energy": statistics.fmean(finite) if finite else math.nan,
            "by_outcome": by_outcome(stats),
            "correlation": correlations(stats)}


def by_outcome(stats: Sequence[GroupStat]) -> dict[str, Any]:
    """Groups the policy lost every time (no reward > 0), won every time, or neither: how many, and their
    mean action and reasoning energy (over the groups that have such tokens)."""
    kinds = {"all_lost": lambda s: max(s.rewards) <= 0, "all_won": lambda s: min(s.rewards) > 0,
             "mixed": lambda s: max(s.rewards) > 0 >= min(s.rewards)}
    out: dict[str, Any] = {}
    for name, is_kind in kinds.items():
        chosen = [s for s in stats if is_kind(s)]
        row: dict[str, Any] = {"groups": len(chosen)}
        for kind in ("action", "reasoning"):
            e = [getattr(s, f"{kind}_energy") for s in chosen if math.isfinite(getattr(s, f"{kind}_energy"))]
            row[f"mean_{kind}_energy"] = statistics.fmean(e) if e else math.nan
        out[name] = row
    return out


def table(summary: dict[str, Any]) -> str:
    """The README's table (markdown)."""
    def c(d: dict[str, Any]) -> str:
        if not math.isfinite(d["pearson"]):
            return "undefined"
        lo, hi = d["ci95"]
        return f"{d['pearson']:+.2f} [{lo:+.2f}, {hi:+.2f}] (Spearman {d['spearman']:+.2f})"

    lines = ["| env | reference | groups × episodes | groups with reward variance | "
             "success (%) | action-token share (%) | corr. action energy, Pearson [95% CI] | "
             "corr. reasoning energy |", "|" + "---|" * 8]
    for env, refs in summary["envs"].items():
        for ref, s in refs.items():
            size = s["episodes"] // max(s["groups"], 1)
            lines.append(f"| {env} | {ref} | {s['groups']} × {size} | {s['groups_with_reward_variance']} | "
                         f"{100 * s['success_rate']:.1f} | {100 * s['action_token_share']:.1f} | "
                         f"{c(s['correlation']['action'])} | {c(s['correlation']['reasoning'])} |")
    lines += ["", "| env | reference | action energy vs reward variance, varying groups only | reasoning, "
              "varying groups only | action energy vs mean reward | reasoning energy vs mean reward |",
              "|" + "---|" * 6]
    for env, refs in summary["envs"].items():
        for ref, s in refs.items():
            a, r = s["correlation"]["action"], s["correlation"]["reasoning"]
            lines.append(f"| {env} | {ref} | {c(a['varying_groups_only'])} | {c(r['varying_groups_only'])} | "
                         f"{c(a['vs_mean_reward'])} | {c(r['vs_mean_reward'])} |")
    return "\n".join(lines)


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, allow_nan=True) + "\n")


def _model_dir(name: str, env: str, data: str) -> str:
    from swerl.models.shipped import resolve_model

    path = resolve_model(name.replace("{env}", env))
    if not Path(path).is_dir():
        raise RuntimeError(f"{name!r} for {env}: no model directory at {path} (the SmolLM2 warm start: "
                           "scripts/experiment_credit.py --config configs/experiment/credit_smollm2_cpu.yaml "
                           f"--warm-start-only envs=[{env}] 'data=[\"{data}\"]')")
    return path


def run(cfg: DiagnosticConfig) -> dict[str, Any]:
    """Sample every env's groups from the policy, measure them under every reference; the summary."""
    summary: dict[str, Any] = {"config": asdict(cfg), "envs": {}, "seconds": {}}
    models = {env: (_model_dir(cfg.policy, env, data),  # every env's, before anything is sampled
                    {ref_label(r.replace("{env}", env)): _model_dir(r, env, data) for r in cfg.references})
              for env, data in zip(cfg.envs, cfg.data, strict=True)}
    for env, data in zip(cfg.envs, cfg.data, strict=True):
        policy, refs = models[env]
        out = Path(cfg.out) / env
        t = time.monotonic()
        sample_groups(cfg, env, data, policy, out / "samples")
        summary["seconds"][f"{env}/sample"] = time.monotonic() - t
        trajs, groups, games, names = load_groups(out / "samples")
        if not trajs:
            raise RuntimeError(f"{env}: no episode ran (see {out / 'samples' / 'eval.log'})")
        summary["envs"][env] = {}
        for label, path in refs.items():
            t = time.monotonic()
            energies = cached_energies(path, trajs, names, out / "energy" / label,
                                       temperature=cfg.temperature, micro_batch_tokens=cfg.micro_batch_tokens,
                                       threads=cfg.threads)
            stats = group_stats(energies, trajs, groups, games)
            s = summarise(stats, trajs)
            s.update(policy=policy, reference=path, group_values=[asdict(g) for g in stats])
            summary["envs"][env][label] = s
            summary["seconds"][f"{env}/energy/{label}"] = time.monotonic() - t
            a = s["correlation"]["action"]
            print(f"{env}, reference {label}: {s['groups']} groups, {s['groups_with_reward_variance']} with "
                  f"reward variance, success {s['success_rate']:.1%}; action corr {a['pearson']:+.3f} "
                  f"[{a['ci95'][0]:+.3f}, {a['ci95'][1]:+.3f}]", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML of DiagnosticConfig fields (default: SmolLM2 on 2 cores)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. groups=50 envs=[frozenlake]")
    args = ap.parse_args(argv)
    try:
        cfg = load(DiagnosticConfig, args.config, args.overrides)
    except ValueError as e:
        print(f"diagnostic_energy: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        summary = run(cfg)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"diagnostic_energy: {e}", file=sys.stderr)
        return 1
    summary["seconds"]["total"] = time.monotonic() - t0
    _write_json(Path(cfg.out) / "diagnostic_energy.json", summary)
    if cfg.bench_out:
        _write_json(ROOT / cfg.bench_out, summary)
    print(table(summary))
    print(f"\n{Path(cfg.out) / 'diagnostic_energy.json'} ({summary['seconds']['total'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
