"""Supervised warm start (`swerl sft`): a model learns a text-game kind's expert play before RL.

No pretrained weights can be downloaded on the build machines, and a random-init policy never wins a
game, so GRPO has nothing to compare. `swerl sft` plays each training game once with the kind's expert
(its solver's plan, `GameListing.expert_plans`) through the same episode loop and chat template RL
uses, so the demonstrations are token-exact trajectories in RL's own format. Before each action the
expert writes its reasoning inside `<think>`: it restates the state it sees and names the move, so
reasoning tokens outnumber action tokens as in a real model's turns (the share is reported: ActFocus
measured about 4% action tokens on Sokoban). The model is then trained with cross-entropy on the
generated tokens only (`Trajectory.loss_mask`), and greedy held-out success is measured with the
in-process engine. The result is an HF directory `swerl train model.path=OUT/model` starts from.

    swerl sft --config configs/sft_sokoban.yaml out=runs/sft-sokoban epochs=6
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swerl.files import atomic_write
from swerl.models import QWEN2_VOCAB_SMALL, ModelConfig, make_tiny_qwen
from swerl.structs import EpisodeLimits, Generation, SamplingParams, Trajectory


@dataclass
class SFTConfig:
    """`swerl sft`: expert demonstrations of one text-game kind, a model trained on them, its held-out
    success (YAML + dotted key=value overrides, as `swerl train`)."""

    kind: str = "sokoban"
    """The text-game kind (swerl.envs.registry): sokoban, frozenlake, sudoku, alfworld or webshop."""
    data: str = ""
    """The kind's game data (as env.<kind>.data of `swerl train`); puzzles: generator options, e.g.
    `dim=6`."""
    train_games: int = 256
    """Games of the train split played by the expert (0: all of them)."""
    heldout_games: int = 64
    """Games of the held-out split the trained model is evaluated on (0: all of them)."""
    max_turns: int = 12
    """Turn budget of every episode (expert and evaluation), as rollout.max_turns in training."""
    reasoning: bool = True
    """The expert reasons inside <think> before each action (False: actions only)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The initial model, as `swerl train`'s `model` (path empty: a random-init tiny Qwen2 of its
    sizes with the real Qwen tokenizer)."""
    epochs: int = 4
    """Passes over the demonstrations."""
    batch_size: int = 8
    """Trajectories per optimizer step."""
    lr: float = 2e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay to 10%)."""
    warmup_ratio: float = 0.05
    """Share of the steps spent warming up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_len: int = 4096
    """Trajectories are cut to this many tokens for training."""
    seed: int = 0
    """Seeds the model init, the shuffling and the engine."""
    out: str = "runs/sft"
    """Output directory: model/ (HF), sft.json (report)."""
    eval_every: int = 0
    """Also evaluate held-out success after every N epochs (0: only at the end)."""
    eval_max_new_tokens: int = 256
    """Token budget of one model turn in evaluation."""
    compact_vocab: bool = False
    """Give the tiny model (model.path empty) a compact vocabulary: only the Qwen token ids the
    demonstrations, the chat markup and single ASCII characters use, renumbered (swerl.agent.compact).
    The text is tokenized by the real Qwen tokenizer as before; the output layer shrinks from 151,936
    rows to a few hundred, which makes a CPU model ~20x cheaper. Such a model is served by the hf
    engine only."""

    def __post_init__(self) -> None:
        from swerl.envs.registry import game_kind_names

        if self.kind not in game_kind_names():
            raise ValueError(f"sft kind must be a text-game kind, one of {game_kind_names()}, got "
                             f"{self.kind!r}")
        for name in ("max_turns", "epochs", "batch_size", "max_len", "eval_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft {name} must be >= 1, got {getattr(self, name)}")
        for name in ("train_games", "heldout_games", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"sft {name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or not 0 <= self.warmup_ratio < 1 or self.weight_decay < 0:
            raise ValueError("sft needs lr > 0, 0 <= warmup_ratio < 1 and weight_decay >= 0")
        if self.compact_vocab and self.model.path:
            raise ValueError("sft compact_vocab builds a new tiny model's vocabulary: it cannot apply to "
                             f"model.path {self.model.path!r} (leave model.path empty or compact_vocab off)")


@dataclass(frozen=True)
class TokenShare:
    """How the generated tokens of a set of trajectories split into reasoning and action."""

    generated: int
    reasoning: int
    action: int

    @property
    def action_share(self) -> float:
        return self.action / self.generated if self.generated else 0.0


def token_share(trajectories: Sequence[Trajectory]) -> TokenShare:
    """Generated tokens, and those in reasoning (span 1) and action (span 2) spans; the rest of the
    generated tokens are the turn's own markup (end of turn)."""
    gen = reasoning = action = 0
    for t in trajectories:
        for m, s in zip(t.loss_mask, t.span, strict=True):
            if m:
                gen += 1
                reasoning += s == 1
                action += s == 2
    return TokenShare(generated=gen, reasoning=reasoning, action=action)


_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_TRAILER = re.compile(r"\n\n(?:\(Invalid answer.*?\) )?(?:Turns used: |You have \d+ turns)", re.S)


def _grid(lines: list[str]) -> list[str]:
    """The trailing lines of `lines` that form a character grid (equal length, no spaces), or []."""
    grid: list[str] = []
    for line in reversed(lines):
        if not line or " " in line or (grid and len(line) != len(grid[0])):
            break
        grid.insert(0, line)
    return grid if len(grid) > 1 else []


def _pieces(grid: list[str]) -> str:
    """Where each piece of a character grid is (`P at row 2, column 5.`), walls and floor left out."""
    where: dict[str, list[str]] = {}
    for i, row in enumerate(grid, 1):
        for j, c in enumerate(row, 1):
            if c not in "#_.":
                where.setdefault(c, []).append(f"row {i}, column {j}")
    return "\n".join(f"{c} at {'; '.join(cells)}." for c, cells in where.items())


def narrate(prompt_text: str, action: str) -> str:
    """The expert's reasoning before `action`: the state it was just shown (the last paragraph of the
    last user message, before the turn counter), where the pieces of a grid are, then the move."""
    users = _USER.findall(prompt_text)
    last = re.sub(r"</?tool_response>\n?", "", users[-1] if users else "")
    body = _TRAILER.split(last, maxsplit=1)[0].rstrip()
    state = body.rsplit("\n\n", 1)[-1].strip()
    grid = _grid(state.splitlines())
    pieces = _pieces(grid) if grid else ""
    return (f"The current state is:\n{state}\n" + (f"{pieces}\n" if pieces else "")
            + f"I pick the move that follows my plan from here: {action}.")


class ReasoningExpert:
    """An engine that plays the expert's plans (`swerl.envs.textgame.expert.ExpertEngine`), each action after
    a `<think>` block of `narrate`'s reasoning."""

    def __init__(self, tokenizer: Any, plans: dict[str, Sequence[str]], *, reasoning: bool = True) -> None:
        from swerl.envs.textgame.expert import ExpertEngine

        self.expert = ExpertEngine(tokenizer, plans)
        self.tokenizer = tokenizer
        self.reasoning = reasoning

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        from swerl.envs.textgame.expert import scripted_turn

        plain = await self.expert.generate(prompt_ids, SamplingParams(max_new_tokens=4096))
        tag = self.expert.tag
        found = re.search(f"<{tag}>(.*?)</{tag}>", self.tokenizer.decode(list(plain.token_ids)), re.S)
        action = found.group(1) if found else "look"
        thought = narrate(self.tokenizer.decode(prompt_ids, skip_special_tokens=False), action) \
            if self.reasoning else ""
        ids = [*self.tokenizer(scripted_turn(action, thought, tag=tag),
                               add_special_tokens=False)["input_ids"],
               self.tokenizer.eos_token_id][:params.max_new_tokens]
        finish = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
        return Generation(token_ids=tuple(ids), logprobs=(0.0,) * len(ids), finish_reason=finish)

    async def close(self) -> None:
        return None


def _task_set(cfg: SFTConfig, split: str, limit: int) -> Any:
    from swerl.envs.registry import game_kind
    from swerl.envs.textgame.tasks import GameTaskConfig, GameTaskSet

    _, listing = game_kind(cfg.kind)
    section = GameTaskConfig(data=cfg.data, split=split, limit=limit, sandbox=False)
    return GameTaskSet(cfg.kind, listing, section, max_steps=cfg.max_turns)


def _play(tasks: Any, engine: Any, tokenizer: Any, params: SamplingParams,
          max_turns: int) -> list[Trajectory]:
    from swerl.rollout.runner import run_episodes

    specs = [s for g, tid in enumerate(tasks.ids) for s in tasks.specs(tid, g, 1)]
    results = asyncio.run(run_episodes(specs, engine, tokenizer, params=params,
                                       limits=EpisodeLimits(max_turns=max_turns), progress=False))
    failed = [r for r in results if r.trajectory is None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} episodes failed: {failed[0].error}")
    return [r.trajectory for r in results if r.trajectory is not None]


def demonstrations(cfg: SFTConfig, tokenizer: Any) -> tuple[list[Trajectory], float]:
    """The expert's trajectories on the train split, and the share of them it won (its plans are a
    solver's, so anything below 1 means a plan does not fit its game)."""
    from swerl.envs.registry import game_kind

    kind, listing = game_kind(cfg.kind)
    tasks = _task_set(cfg, "train", cfg.train_games)
    plans = listing.expert_plans(list(tasks.ids), cfg.data or None)
    engine = ReasoningExpert(tokenizer, plans, reasoning=cfg.reasoning)
    trajs = _play(tasks, engine, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=4096),
                  cfg.max_turns)
    won = sum(kind.success(t) for t in trajs) / len(trajs)
    return trajs, won


def heldout_success(cfg: SFTConfig, model: Any, tokenizer: Any) -> tuple[float, list[Trajectory]]:
    """Greedy success of `model` on the held-out split (the registry's), in this process."""
    import torch

    from swerl.envs.registry import game_kind
    from swerl.rollout.config import HFEngineConfig
    from swerl.rollout.hf import HFEngine

    kind, _ = game_kind(cfg.kind)
    tasks = _task_set(cfg, kind.heldout_split, cfg.heldout_games)
    was_training = model.training
    engine = HFEngine(model, seed=cfg.seed, max_batch=16, prefix_cache_mb=HFEngineConfig.prefix_cache_mb)
    try:
        with torch.no_grad():
            trajs = _play(tasks, engine, tokenizer, SamplingParams(temperature=0.0,
                                                                   max_new_tokens=cfg.eval_max_new_tokens),
                          cfg.max_turns)
    finally:
        model.train(was_training)
    return sum(kind.success(t) for t in trajs) / len(trajs), trajs


def _initial_model(cfg: SFTConfig, out: Path, tokenizer: Any) -> Any:
    from transformers import AutoModelForCausalLM

    m = cfg.model
    if m.path:
        return AutoModelForCausalLM.from_pretrained(m.path, dtype="float32")
    init = make_tiny_qwen(out / "init", hidden_size=m.hidden_size, num_layers=m.num_layers,
                          num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                          intermediate_size=m.intermediate_size, seed=m.seed, tokenizer=tokenizer,
                          vocab_size=len(tokenizer) if cfg.compact_vocab else QWEN2_VOCAB_SMALL)
    return AutoModelForCausalLM.from_pretrained(init, dtype="float32")


def sft_loss(model: Any, batch: Sequence[Trajectory], max_len: int) -> Any:
    """Mean cross-entropy of the generated tokens of `batch` (each trajectory cut to `max_len`), the
    next-token targets masked to `loss_mask`. The output layer runs on the target positions only: over
    Qwen's 151,936-token vocabulary, logits at every position would dwarf the rest of the model."""
    import torch

    seqs = [t.token_ids[:max_len] for t in batch]
    masks = [t.loss_mask[:max_len] for t in batch]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)  # (B, T)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)  # (B, T)
    target = torch.zeros(len(seqs), width, dtype=torch.bool)  # (B, T) positions whose token is learned
    for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        target[i, :len(s)] = torch.tensor(m, dtype=torch.bool)
    target[:, 0] = False  # nothing predicts the first token
    hidden = model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, T, H)
    # the state at t predicts the token at t + 1
    h = hidden[:, :-1][target[:, 1:]]  # (N, H)
    logits = model.get_output_embeddings()(h)  # (N, V)
    return torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][target[:, 1:]])


@dataclass(frozen=True)
class SFTReport:
    """What `swerl sft` did (also written to OUT/sft.json)."""

    kind: str
    model_dir: str
    train_games: int
    heldout_games: int
    expert_win_rate: float
    """The expert's own success on the train games (1.0 when every plan fits its game)."""
    tokens: TokenShare
    """Generated tokens of the demonstrations by span."""
    epoch_loss: tuple[float, ...]
    heldout_success: float
    """Greedy success of the trained model on the held-out games."""
    heldout_curve: tuple[tuple[int, float], ...] = ()
    """(epoch, held-out success) at each evaluation, the last one included."""
    init_heldout_success: float = 0.0
    """The same before training (a random-init model: 0)."""
    seconds: dict[str, float] = field(default_factory=dict)


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def sft(cfg: SFTConfig, *, log: Any = print) -> SFTReport:
    """Demonstrate, train, evaluate, save (see the module docstring)."""
    import torch

    from swerl.agent import load_tokenizer
    from swerl.models.shipped import resolve_model

    if cfg.model.path:  # a shipped model's name: its imported directory (imported on first use)
        model = dataclasses.replace(cfg.model, path=resolve_model(cfg.model.path))
        cfg = dataclasses.replace(cfg, model=model)

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.model.tokenizer or (cfg.model.path or None))
    t0 = time.monotonic()
    demos, expert_won = demonstrations(cfg, tokenizer)
    if cfg.compact_vocab:
        from swerl.agent.compact import compact_vocabulary

        tokenizer = compact_vocabulary(tokenizer, (t.token_ids for t in demos))
        demos = [dataclasses.replace(t, token_ids=tuple(tokenizer.to_compact(t.token_ids))) for t in demos]
        log(f"compact vocabulary: {len(tokenizer)} ids")
    share = token_share(demos)
    seconds = {"demonstrations": time.monotonic() - t0}
    log(f"{len(demos)} expert episodes on {cfg.kind} (expert won {expert_won:.0%}); generated tokens "
        f"{share.generated}: {share.action_share:.1%} action, "
        f"{share.reasoning / max(share.generated, 1):.1%} "
        "reasoning")

    model = _initial_model(cfg, out, tokenizer)
    t = time.monotonic()
    init_success = heldout_success(cfg, model, tokenizer)[0] if cfg.eval_every else 0.0
    seconds["eval"] = time.monotonic() - t
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    steps_per_epoch = math.ceil(len(demos) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    warm = max(1, int(cfg.warmup_ratio * total))

    def lr_at(step: int) -> float:  # linear warm-up, cosine to 10% of the peak
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    eval_in_loop = 0.0
    losses: list[float] = []
    curve: list[tuple[int, float]] = []
    model.train()
    t = time.monotonic()
    for epoch in range(1, cfg.epochs + 1):
        order = list(range(len(demos)))
        rng.shuffle(order)
        total_loss = 0.0
        for b in range(0, len(order), cfg.batch_size):
            loss = sft_loss(model, [demos[i] for i in order[b:b + cfg.batch_size]], cfg.max_len)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total_loss += float(loss.detach())
        losses.append(total_loss / steps_per_epoch)
        line = f"epoch {epoch}/{cfg.epochs}: loss {losses[-1]:.4f}"
        if cfg.eval_every and epoch % cfg.eval_every == 0 and epoch != cfg.epochs:
            te = time.monotonic()
            curve.append((epoch, heldout_success(cfg, model, tokenizer)[0]))
            eval_in_loop += time.monotonic() - te
            line += f", held-out success {curve[-1][1]:.1%}"
        log(line)
    seconds["train"] = time.monotonic() - t - eval_in_loop
    te = time.monotonic()
    success, heldout = heldout_success(cfg, model, tokenizer)
    seconds["eval"] += eval_in_loop + time.monotonic() - te
    curve.append((cfg.epochs, success))

    model_dir = out / "model"
    tmp = out / "model.tmp"
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if model_dir.exists():
        import shutil

        shutil.rmtree(model_dir)
    os.replace(tmp, model_dir)
    report = SFTReport(kind=cfg.kind, model_dir=str(model_dir), train_games=len(demos),
                       heldout_games=len(heldout), expert_win_rate=expert_won, tokens=share,
                       epoch_loss=tuple(losses), heldout_success=success, heldout_curve=tuple(curve),
                       init_heldout_success=init_success, seconds=seconds)
    _write_json(out / "sft.json",
                {**asdict(report), "action_share": share.action_share, "config": asdict(cfg)})
    log(f"held-out success {success:.1%} on {report.heldout_games} games; model in {model_dir}")
    return report

