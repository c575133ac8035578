"""Credit assignment, reproduced small: uniform GRPO vs ActFocus vs AEM vs both, from one warm start.

    .venv/bin/python scripts/experiment_credit.py                      # the CPU default (2 cores)
    .venv/bin/python scripts/experiment_credit.py --config configs/experiment/credit_gpu.yaml
    .venv/bin/python scripts/experiment_credit.py seeds=[0] steps=4    # key=value overrides

For each env (default FrozenLake and Sokoban):
1. a warm start: `swerl sft` on the env's expert plans (a random-init model never wins, so GRPO would
   have nothing to compare), cached in OUT/<env>/warm;
2. every arm x seed: `swerl train` from that warm start, same seeds across arms (so arm differences are
   not sampling luck of the tasks), in OUT/<env>/<arm>/seed<k>; the frozen reference is the warm start,
   whose energy pass runs in every arm (`algo.actfocus.measure`), so the paper's diagnostic is measured
   on uniform GRPO too;
3. the summary, OUT/experiment_credit.json (also `bench_out`) and a figure
   OUT/experiment_credit.png: train and held-out success curves (mean and min-max band over seeds),
   entropy curves, action-token share, the correlation between a group's mean action-token (and
   reasoning-token) reference energy and its reward variance, pooled over every step and seed of the
   arm with a 95% Fisher-z interval, and peak-to-final held-out degradation.

Finished runs are skipped and interrupted ones resume (swerl train resumes from its checkpoints), so the
command can be rerun after a kill. Runs go `jobs` at a time, each on `threads` torch threads: on small
models two single-threaded processes get more from 2 cores than one process on both.

Arms (the swerl train switches they set):
    uniform   plain GRPO                          (algo.actfocus.measure=true, for the diagnostic)
    actfocus  + ActFocus token weights            (algo.actfocus.enabled=true, alpha, beta)
    aem       + AEM per-response advantage scale  (algo.aem.enabled=true)
    both      ActFocus and AEM
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swerl.algo.diagnostics import GroupEnergies, correlation_ci, energy_reward_correlation  # noqa: E402
from swerl.config import load  # noqa: E402
from swerl.files import atomic_path, atomic_write  # noqa: E402
from swerl.models import ModelConfig  # noqa: E402

ARMS = {
    "uniform": {"actfocus": {"measure": True}},
    "actfocus": {"actfocus": {"enabled": True}},
    "aem": {"aem": {"enabled": True}, "actfocus": {"measure": True}},
    "both": {"aem": {"enabled": True}, "actfocus": {"enabled": True}},
}
"""Each arm's algo switches (merged into the shared algo section)."""

TINY = {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 512}
"""The CPU model: 2 layers of width 128 (0.5M parameters besides the compact vocabulary's rows)."""


@dataclass(frozen=True)
class ExperimentConfig:
    """The credit-assignment experiment (YAML + key=value overrides; defaults: the 2-core CPU size)."""

    out: str = "runs/experiment_credit"
    """Output directory: warm starts, runs, summary JSON and figure."""
    envs: tuple[str, ...] = ("frozenlake", "sokoban")
    """Text-game kinds (swerl.envs.registry), each with its own warm start."""
    data: tuple[str, ...] = ("", "dim=5,min_moves=1,max_moves=4")
    """Generator options per env (as env.<kind>.data), aligned with envs; '' for the defaults. Sokoban's
    default here: 5x5 rooms (3x3 inside) with 1-4-move solutions; on 6x6 rooms with up to 20 moves a
    2-layer model's warm start never wins."""
    arms: tuple[str, ...] = ("uniform", "actfocus", "aem", "both")
    """Arms to run (uniform, actfocus, aem, both)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """RL seeds (the warm start is one per env, seed 0)."""
    steps: int = 16
    """RL steps per run."""
    group_size: int = 8
    """Rollouts per task (the GRPO group)."""
    tasks_per_step: int = 4
    """Tasks per step (batch = tasks_per_step x group_size episodes)."""
    eval_every: int = 4
    """Held-out success every N steps (and at step 0 from the warm start's report, and the last step)."""
    eval_games: int = 32
    """Held-out games per evaluation (greedy)."""
    max_turns: int = 8
    """Turn budget of every episode."""
    max_new_tokens: int = 160
    """Token budget of one model turn."""
    lr: float = 1e-4
    """RL learning rate (AdamW). At 5e-4 the tiny model's warm start collapsed within 5 steps (train
    success to 0, entropy doubling) in every arm tried."""
    temperature: float = 0.7
    """Rollout sampling temperature. At 1.0 the tiny warm start (whose greedy play wins 40%) samples few
    wins, and 8 probe steps moved held-out success 40.6% → 38%; at 0.7, 40.6% → 44%."""
    actfocus_alpha: float = 0.1
    """ActFocus weight of reasoning tokens (the paper's best on Sokoban: 0.1)."""
    actfocus_beta: float = 0.5
    """ActFocus extra weight of uncertain action tokens."""
    aem_lam: float = 1.0
    """AEM's lambda."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(**TINY))
    """The initial model: a checkpoint (model.path, e.g. a Qwen2.5-0.5B/1.5B-Instruct directory on a GPU
    machine) or a random-init tiny Qwen2 of these sizes (path empty; default TINY, which keys not given
    keep)."""
    compact_vocab: bool = True
    """Tiny model only: a compact vocabulary (swerl.agent.compact), ~20x cheaper on CPU."""
    sft_games: int = 384
    """Expert games of the warm start."""
    sft_epochs: int = 8
    """Warm-start epochs."""
    sft_lr: float = 2e-3
    """Warm-start learning rate."""
    sft_batch_size: int = 8
    """Warm-start trajectories per optimizer step (their activations are held at once: a real model's
    30 layers need about 1.5 GB per 1,000 tokens on CPU)."""
    engine: str = "hf"
    """Rollout engine of the RL runs (hf in process; sglang / vllm for a GPU run with a checkpoint)."""
    device: str = "cpu"
    """Learner device (cpu / cuda)."""
    micro_batch_tokens: int = 8192
    """Tokens per forward/backward of the RL learner (optim.micro_batch_tokens): bounds the activations
    each run holds, which `jobs` runs hold at once."""
    jobs: int = 2
    """Runs in parallel."""
    threads: int = 1
    """Torch threads per run (OMP_NUM_THREADS)."""
    bench_out: str = "bench_out/experiment_credit.json"
    """Also write the summary JSON here, relative to the repository (empty: only OUT's copy)."""
    train_overrides: tuple[str, ...] = ()
    """Extra key=value overrides for every `swerl train` run (e.g. learner.backend=deepspeed)."""

    def __post_init__(self) -> None:
        from swerl.envs.registry import game_kind_names

        bad = [e for e in self.envs if e not in game_kind_names()]
        if bad:
            raise ValueError(f"envs: {bad} are not text-game kinds; choose from {game_kind_names()}")
        if len(self.data) != len(self.envs):
            raise ValueError(f"data needs one entry per env ({len(self.envs)}), got {len(self.data)}")
        bad = [a for a in self.arms if a not in ARMS]
        if bad:
            raise ValueError(f"arms: {bad} unknown; choose from {list(ARMS)}")
        if not self.seeds:
            raise ValueError("seeds: at least one seed")
        for name in ("steps", "group_size", "tasks_per_step", "eval_every", "eval_games", "max_turns",
                     "max_new_tokens", "sft_games", "sft_epochs", "jobs", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: GRPO compares rollouts within a group")


# ---- running ----------------------------------------------------------------------------------------------


def _env(cfg: ExperimentConfig) -> dict[str, str]:
    n = str(cfg.threads)
    return {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT)}


_LIVE: set[subprocess.Popen[bytes]] = set()
"""The runs' processes now running (guarded by _LIVE_LOCK), so that stopping stops them too."""
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> None:
    if _STOPPING.is_set():
        raise RuntimeError("the experiment is stopping")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            code = proc.wait()
        except BaseException as e:  # SIGTERM / Ctrl-C while this thread waits (the main one: the warm start)
            _stop(proc, signalled=isinstance(e, KeyboardInterrupt))  # Ctrl-C reached its process group
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    if code:
        tail = log.read_text().strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{' '.join(cmd[2:5])} failed (exit {code}): {tail[0]} (log: {log})")


def _stop_runs() -> None:
    """SIGTERM every run still going (each `swerl train` / `swerl sft` cleans up and its next start
    resumes), then wait for them; nothing new starts."""
    _STOPPING.set()
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        _stop(proc, signalled=True)


def _stop(proc: subprocess.Popen[bytes], *, signalled: bool) -> None:
    """SIGTERM `proc` unless it has been `signalled` (a second SIGTERM kills a swerl command at once,
    before its cleanup) and wait for it; SIGKILL after 120 s."""
    _STOPPING.set()
    if not signalled and proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def warm_start(cfg: ExperimentConfig, env: str, data: str) -> tuple[Path, dict[str, Any]]:
    """The env's warm-start model directory and its `swerl sft` report (trained once, then reused)."""
    out = Path(cfg.out) / env / "warm"
    report = out / "sft.json"
    m = cfg.model
    sft = {"kind": env, "data": data, "train_games": cfg.sft_games, "heldout_games": cfg.eval_games,
           "max_turns": cfg.max_turns, "epochs": cfg.sft_epochs, "lr": cfg.sft_lr,
           "batch_size": cfg.sft_batch_size, "out": str(out),
           "eval_max_new_tokens": cfg.max_new_tokens, "compact_vocab": cfg.compact_vocab and not m.path,
           "model": asdict(m)}
    text = yaml.safe_dump(sft, sort_keys=False)
    if report.is_file() and (out / "sft.yaml").is_file() and (out / "sft.yaml").read_text() == text:
        return out / "model", json.loads(report.read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft.yaml").write_text(text)
    # the warm start is one process: it may use every thread (torch's matmuls are MKL's: both variables)
    n = str(cfg.jobs * cfg.threads)
    env_vars = {**_env(cfg), "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
    _run([sys.executable, "-m", "swerl", "sft", "--config", str(out / "sft.yaml")], out / "sft.log", env_vars)
    return out / "model", json.loads(report.read_text())


def train_config(cfg: ExperimentConfig, env: str, data: str, arm: str, seed: int, model_dir: Path) -> dict:
    """The `swerl train` config of one run."""
    algo: dict[str, Any] = {"estimator": "grpo", "temperature": cfg.temperature,
                            "aem": {"enabled": False, "lam": cfg.aem_lam},
                            "actfocus": {"enabled": False, "alpha": cfg.actfocus_alpha,
                                         "beta": cfg.actfocus_beta}}
    for key, switches in ARMS[arm].items():
        algo[key] = {**algo[key], **switches}
    batch = cfg.group_size * cfg.tasks_per_step
    return {
        "run_dir": str(run_dir(cfg, env, arm, seed)), "steps": cfg.steps, "group_size": cfg.group_size,
        "batch_episodes": batch, "checkpoint_every": cfg.eval_every, "keep_checkpoints": 1,
        "export_final": False, "seed": seed, "eval_every": cfg.eval_every,
        "eval": {"limit": cfg.eval_games, "k": 1, "temperature": 0.0, "seed": 1234}, "device": cfg.device,
        "model": {"path": str(model_dir)},
        "rollout": {"engine": cfg.engine, "max_new_tokens": cfg.max_new_tokens, "max_turns": cfg.max_turns,
                    "max_context_tokens": 8192, "max_episodes": batch, "engine_concurrency": batch,
                    **({"hf": {"max_batch": batch, "seed": seed}} if cfg.engine == "hf" else {})},
        "env": {"kind": env, env: {"data": data, "split": "train", "sandbox": False}},
        "algo": algo,
        "optim": {"lr": cfg.lr, "grad_clip": 1.0, "micro_batch_tokens": cfg.micro_batch_tokens},
        "metrics": {"progress": False},
    }


def run_dir(cfg: ExperimentConfig, env: str, arm: str, seed: int) -> Path:
    return Path(cfg.out) / env / arm / f"seed{seed}"


def _done(cfg: ExperimentConfig, d: Path) -> bool:
    rows = _rows(d)
    return bool(rows) and rows[-1].get("train_step") == cfg.steps


def train_one(cfg: ExperimentConfig, env: str, data: str, arm: str, seed: int, model_dir: Path) -> float:
    """One RL run (skipped when finished); returns the seconds it took."""
    d = run_dir(cfg, env, arm, seed)
    path = d.with_suffix(".yaml")
    # the overrides ride along as a comment, so that a rerun with other ones is seen below
    text = (yaml.safe_dump(train_config(cfg, env, data, arm, seed, model_dir), sort_keys=False)
            + f"# train_overrides: {json.dumps(list(cfg.train_overrides))}\n")
    if path.is_file() and path.read_text() != text:
        raise RuntimeError(f"{d} was made with another config or train_overrides: give this experiment "
                           "another out= (or remove that run) rather than mix the two in one table")
    if _done(cfg, d):
        return 0.0
    d.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    t = time.monotonic()
    _run([sys.executable, "-m", "swerl", "train", "--config", str(path), *cfg.train_overrides],
         d.with_suffix(".log"), _env(cfg))
    return time.monotonic() - t


# ---- summarising ------------------------------------------------------------------------------------------


def _rows(d: Path) -> list[dict[str, Any]]:
    path = d / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _band(curves: Sequence[dict[int, float]]) -> dict[str, list[float]]:
    """Mean, min and max over seeds at the steps every seed has."""
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    vals = [[c[s] for c in curves] for s in steps]
    return {"step": steps, "mean": [statistics.fmean(v) for v in vals], "min": [min(v) for v in vals],
            "max": [max(v) for v in vals]}


def _mean_sd(xs: Sequence[float]) -> dict[str, float]:
    xs = [x for x in xs if _finite(x)]
    if not xs:
        return {"mean": math.nan, "sd": math.nan, "n": 0}
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def _pooled(groups: GroupEnergies) -> dict[str, Any]:
    """The correlation over every (group energy, group reward variance) pair of an arm, per token kind."""
    out: dict[str, Any] = {}
    for kind, energy in (("action", groups.action), ("reasoning", groups.reasoning)):
        n = sum(_finite(e) and _finite(v) for e, v in zip(energy, groups.reward_var, strict=True))
        pearson, spearman = energy_reward_correlation(energy, groups.reward_var)
        lo, hi = correlation_ci(pearson, n)
        out[kind] = {"pearson": pearson, "ci95": [lo, hi], "spearman": spearman, "groups": n}
    return out


def summarise_arm(cfg: ExperimentConfig, env: str, arm: str, warm: dict[str, Any]) -> dict[str, Any]:
    """One arm's numbers over its seeds (see the module docstring)."""
    train_c, val_c, ent_c = [], [], []
    shares, peak_drop, finals, bests = [], [], [], []
    act, rea, var = [], [], []
    for seed in cfg.seeds:
        rows = _rows(run_dir(cfg, env, arm, seed))
        if not rows:
            continue
        train_c.append({r["train_step"]: r["reward/success_rate"] for r in rows
                        if _finite(r.get("reward/success_rate"))})
        ent_c.append({r["train_step"]: r["actor/entropy"] for r in rows if _finite(r.get("actor/entropy"))})
        val = {0: float(warm["heldout_success"])}
        val.update({r["train_step"]: r["val/success_rate"] for r in rows
                    if _finite(r.get("val/success_rate"))})
        val_c.append(val)
        held = [val[s] for s in sorted(val)]
        finals.append(held[-1])
        bests.append(max(held))
        peak_drop.append(max(held) - held[-1])
        shares.extend(r["actfocus/action_token_share"] for r in rows
                      if _finite(r.get("actfocus/action_token_share")))
        for r in rows:
            act.extend(r.get("actfocus/group_energy_action") or ())
            rea.extend(r.get("actfocus/group_energy_reasoning") or ())
            var.extend(r.get("actfocus/group_reward_var") or ())
    nan = float("nan")
    pooled = _pooled(GroupEnergies(tuple(nan if a is None else a for a in act),
                                   tuple(nan if a is None else a for a in rea),
                                   tuple(nan if v is None else v for v in var)))
    return {"seeds": len(train_c), "train_success": _band(train_c), "heldout_success": _band(val_c),
            "entropy": _band(ent_c), "final_heldout": _mean_sd(finals), "best_heldout": _mean_sd(bests),
            "peak_to_final_drop": _mean_sd(peak_drop),
            "final_train_success": _mean_sd([statistics.fmean([c[s] for s in sorted(c)[-3:]])
                                             for c in train_c if c]),
            "action_token_share": _mean_sd(shares), "energy_reward_corr": pooled}


def figure(summary: dict[str, Any], path: Path) -> None:
    """Per env: train success, held-out success, entropy (bands over seeds), energy-reward correlation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(summary["envs"])
    fig, axes = plt.subplots(len(envs), 4, figsize=(17, 3.6 * len(envs)), squeeze=False)
    colours = {"uniform": "#444444", "actfocus": "#1f77b4", "aem": "#d62728", "both": "#2ca02c"}
    for i, env in enumerate(envs):
        arms = summary["envs"][env]["arms"]
        for j, (key, title) in enumerate((("train_success", "train success"),
                                          ("heldout_success", "held-out success (greedy)"),
                                          ("entropy", "policy entropy"))):
            ax = axes[i][j]
            for arm, s in arms.items():
                b = s[key]
                ax.plot(b["step"], b["mean"], label=arm, color=colours.get(arm),
                        marker="o" if j == 1 else None)
                ax.fill_between(b["step"], b["min"], b["max"], color=colours.get(arm), alpha=0.15)
            ax.set_title(f"{env}: {title}")
            ax.set_xlabel("RL step")
            ax.grid(alpha=0.3)
            if j == 0:
                ax.legend(fontsize=8)
        ax = axes[i][3]
        names = list(arms)
        for k, (kind, dx) in enumerate((("action", -0.18), ("reasoning", 0.18))):
            rs = [arms[a]["energy_reward_corr"][kind]["pearson"] for a in names]
            lo = [r - arms[a]["energy_reward_corr"][kind]["ci95"][0] for a, r in zip(names, rs, strict=True)]
            hi = [arms[a]["energy_reward_corr"][kind]["ci95"][1] - r for a, r in zip(names, rs, strict=True)]
            ax.bar([x + dx for x in range(len(names))], rs, width=0.36, yerr=[lo, hi], capsize=3,
                   label=f"{kind} tokens", color=["#1f77b4", "#ff7f0e"][k])
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(f"{env}: corr(ref. energy, group reward var), 95% CI")
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def table(summary: dict[str, Any]) -> str:
    """The README's table (markdown)."""
    def f(d: dict[str, float], pct: bool = True) -> str:
        if not _finite(d["mean"]):
            return "n/a"
        k = 100 if pct else 1
        return f"{k * d['mean']:.1f} ± {k * d['sd']:.1f}" if pct else f"{d['mean']:.3f} ± {d['sd']:.3f}"

    def c(d: dict[str, Any]) -> str:
        if not _finite(d["pearson"]):
            return "n/a"
        return f"{d['pearson']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"

    lines = ["| env | arm | held-out success, final (%) | best (%) | peak-to-final drop (pts) | "
             "train success, last 3 steps (%) | entropy, first → last step (nats/token) | "
             "action-token share (%) | corr. action energy [95% CI] | corr. reasoning energy [95% CI] |",
             "|" + "---|" * 10]
    for env, e in summary["envs"].items():
        for arm, s in e["arms"].items():
            share, ent = s["action_token_share"], s["entropy"]["mean"]
            ent_s = f"{ent[0]:.3f} → {ent[-1]:.3f}" if ent else "n/a"
            lines.append(f"| {env} | {arm} | {f(s['final_heldout'])} | {f(s['best_heldout'])} | "
                         f"{f(s['peak_to_final_drop'])} | {f(s['final_train_success'])} | {ent_s} | "
                         f"{100 * share['mean']:.1f} | {c(s['energy_reward_corr']['action'])} | "
                         f"{c(s['energy_reward_corr']['reasoning'])} |")
    return "\n".join(lines)


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, allow_nan=True) + "\n")


def load_config(path: str | None, overrides: Sequence[str]) -> ExperimentConfig:
    """The config of a YAML file (optional) and key=value overrides; a model key they leave out keeps
    its tiny default (TINY)."""
    return load(ExperimentConfig, path, overrides)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML of ExperimentConfig fields (default: the CPU size)")
    ap.add_argument("--summary-only", action="store_true", help="summarise the runs already in OUT")
    ap.add_argument("--warm-start-only", action="store_true",
                    help="make (or reuse) each env's warm start and stop: the policy of "
                         "scripts/diagnostic_energy.py")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. seeds=[0,1] steps=8")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ValueError as e:
        print(f"experiment_credit: {e}", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C, through the handlers that stop the runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    t0 = time.monotonic()
    out = Path(cfg.out)
    warm: dict[str, tuple[Path, dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    try:
        for env, data in zip(cfg.envs, cfg.data, strict=True):
            t = time.monotonic()
            if args.summary_only:
                warm[env] = (out / env / "warm" / "model",
                             json.loads((out / env / "warm" / "sft.json").read_text()))
            else:
                warm[env] = warm_start(cfg, env, data)
            seconds[f"warm_start/{env}"] = time.monotonic() - t
            print(f"{env}: warm start held-out success {warm[env][1]['heldout_success']:.1%}, "
                  f"action share {warm[env][1]['action_share']:.1%}", flush=True)
        if args.warm_start_only:
            return 0
        jobs = [(env, data, arm, seed) for env, data in zip(cfg.envs, cfg.data, strict=True)
                for seed in cfg.seeds for arm in cfg.arms]
        if not args.summary_only:
            with ThreadPoolExecutor(cfg.jobs) as pool:
                futures = {j: pool.submit(train_one, cfg, *j, warm[j[0]][0]) for j in jobs}
                try:
                    for j, fut in futures.items():
                        seconds[f"run/{j[0]}/{j[2]}/seed{j[3]}"] = fut.result()
                        print(f"done {j[0]} {j[2]} seed {j[3]} ({time.monotonic() - t0:.0f} s in)",
                              flush=True)
                except BaseException:
                    # before the pool's exit waits for them: the queued runs never start, running ones stop
                    for fut in futures.values():
                        fut.cancel()
                    _stop_runs()
                    raise
    except (RuntimeError, OSError, KeyError) as e:
        _stop_runs()
        print(f"experiment_credit: {e}", file=sys.stderr)
        return 1
    except BaseException:  # Ctrl-C, SIGTERM: no run is left behind
        _stop_runs()
        raise
    summary: dict[str, Any] = {"config": asdict(cfg), "envs": {}}
    for env in cfg.envs:
        rep = warm[env][1]
        summary["envs"][env] = {
            "warm_start": {k: rep.get(k) for k in ("heldout_success", "action_share", "tokens", "epoch_loss",
                                                     "expert_win_rate", "seconds")},
            "arms": {arm: summarise_arm(cfg, env, arm, rep) for arm in cfg.arms}}
    summary["seconds"] = {**seconds, "total": time.monotonic() - t0}
    _write_json(out / "experiment_credit.json", summary)
    if cfg.bench_out:
        _write_json(ROOT / cfg.bench_out, summary)
    figure(summary, out / "experiment_credit.png")
    print(table(summary))
    print(f"\n{out / 'experiment_credit.json'}, {out / 'experiment_credit.png'} "
          f"({summary['seconds']['total'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
