"""The shared text-game harness (ALFWorld, WebShop, the puzzle games of `swerl.envs.games`): one game
protocol, run in-process or in a sandbox, and the agent environment on top of it.

For a new game (what the WebShop helper needs, and nothing more):

1. Write the game class: constructed from JSON-serialisable keyword arguments (e.g. a data
   directory), implementing `TextGame` (`reset(game_id) -> GameObs`, `step(action) -> GameObs`,
   `close()`). An action that is not admissible returns `GameObs(valid=False, ...)` and leaves the
   game unchanged. Put the task text in `GameObs.info` as `("task", "...")`: `TextGameEnv` shows it
   in the prompt. The module must import only the standard library, `swerl.structs` and the game's
   own libraries, because it also runs inside the text-game image.
2. Register it in `GAME_KINDS` (defined in `swerl.envs.textgame_server`, re-exported here):
   `"webshop": "swerl.envs.webshop:WebShopGame"`.
3. For the sandbox image: append its pinned wheels to `TEXTGAME_REQUIREMENTS`, its source files to
   `TEXTGAME_SOURCES` and its data directory to `TEXTGAME_DATA_DIRS`.
4. Give `TextGameEnv` a `TextGamePrompt` with the game's wording.

Running a game:

    game = make_game("alfworld")                       # in this process
    with DockerSandbox(SandboxSpec(image=build_textgame_image())) as sb, \\
            SandboxTextGame(sb, "alfworld") as game:   # inside a container, over the line protocol
        obs = game.reset(game_id)
        obs = game.step(obs.admissible[0])

    env = TextGameEnv(game, game_id, prompt=MY_PROMPT, config=TextGameConfig())
    traj = await run_episode(env, engine, tokenizer, limits=env.config.episode_limits())

Rewards (`TextGameConfig`): each invalid action costs `invalid_penalty`, a win pays `win_reward`,
and every `StepResult.reward` is the running episode total (the episode keeps the last one).
`max_steps` is enforced by the episode loop as `EpisodeLimits.max_turns` (a truncation, reason
`max_turns`), never by ending the episode as terminated: use `config.episode_limits()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from string import Template
from typing import Any, Protocol, Self, runtime_checkable

from swerl.agent.format import TAG_FORMAT
from swerl.envs.textgame_server import GAME_KINDS, game_class, obs_from_dict
from swerl.sandbox.errors import SandboxError
from swerl.sandbox.session import ExecStream
from swerl.structs import ActionFormat, ChatMessage, EnvStart, EpisodeLimits, GameObs, ParsedTurn, StepResult

REPO_ROOT = Path(__file__).resolve().parents[2]


@runtime_checkable
class TextGame(Protocol):
    """A text game, in this process or behind the line protocol in a sandbox."""

    def reset(self, game_id: str) -> GameObs:
        """Start the game `game_id` from its initial state."""
        ...

    def step(self, action: str) -> GameObs:
        """Play one action; an inadmissible one returns `valid=False` and changes nothing."""
        ...

    def close(self) -> None:
        """Release the game's resources. Idempotent."""
        ...


def make_game(kind: str, **kwargs: Any) -> TextGame:
    """The in-process game of `kind`, constructed exactly as the sandboxed server constructs it."""
    json.dumps(kwargs)  # the same arguments must be able to travel to a sandboxed server
    return game_class(kind)(**kwargs)


class TextGameError(RuntimeError):
    """The game refused a request (unknown game id, a step after the game ended, ...)."""


class GameServerDied(SandboxError):
    """The game server process in the sandbox is gone or stopped answering; start a fresh sandbox."""


# ---- the sandboxed game: the line protocol over a `docker exec` attach socket ----------------------

TEXTGAME_ROOT = "/opt/swerl"
"""Where the image holds the swerl sources and data (the server's working directory)."""
TEXTGAME_USER = "swerl"
"""The unprivileged user the game server runs as."""


class SandboxTextGame:
    """`TextGame` played by `python3 -m swerl.envs.textgame_server` inside a running `DockerSandbox`
    of the text-game image, spoken to over its own `docker exec` stdin/stdout (requests are JSON
    lines, so actions with quotes, newlines or any unicode travel unchanged). The server process
    lives as long as this object (`close()`, or the sandbox's removal); a server that died or stopped
    answering raises `GameServerDied` with its exit status and the end of its stderr.

    `timeout_s`: seconds one request may take (reserved keyword: no game argument may be named so)."""

    def __init__(self, sandbox: Any, kind: str, *, timeout_s: float = 120.0, **kwargs: Any) -> None:
        if kind not in GAME_KINDS:
            raise ValueError(f"unknown text-game kind {kind!r}; known kinds: {', '.join(sorted(GAME_KINDS))}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        container = getattr(sandbox, "container", None)
        if container is None:
            raise SandboxError("SandboxTextGame needs a started DockerSandbox (use `with DockerSandbox(spec) as sb:`)")
        self.kind = kind
        self.timeout_s = timeout_s
        self._label = f"{kind} game server in sandbox {container.id[:12]}"
        self._api = container.client.api
        self._closed = False
        self._dead = ""
        cmd = ["python3", "-m", "swerl.envs.textgame_server", kind, json.dumps(kwargs)]
        try:
            self._exec_id = self._api.exec_create(
                container.id, cmd, stdin=True, stdout=True, stderr=True, tty=False, user=TEXTGAME_USER,
                workdir=TEXTGAME_ROOT,
                environment={"PYTHONPATH": TEXTGAME_ROOT, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                             "HOME": "/tmp"})["Id"]
            sock = self._api.exec_start(self._exec_id, socket=True, demux=False)
        except Exception as e:
            raise GameServerDied(f"could not start the {self._label}: {e}") from e
        self._stream = ExecStream(sock, err_limit=65536)
        # Loading a game's libraries can take seconds (TextWorld's grammar parser); then it says ready.
        ready = self._read_reply(time.monotonic() + max(timeout_s, 60.0))
        if not ready.get("ok"):
            self._shutdown()
            raise GameServerDied(f"the {self._label} could not start: {ready.get('error')}"
                                 f"{self._stderr_note()}")

    # ---- wire ----------------------------------------------------------------------------------
    def _stderr_note(self) -> str:
        tail = self._stream.err[-2000:].decode("utf-8", "replace").strip()
        return f"\n--- server stderr (end) ---\n{tail}" if tail else ""

    def _died(self, what: str) -> GameServerDied:
        status = ""
        try:
            info = self._api.exec_inspect(self._exec_id)
            if not info.get("Running"):
                status = f" (exit status {info.get('ExitCode')})"
        except Exception as e:  # the container itself is gone
            status = f" (the sandbox is gone: {e})"
        self._dead = f"{what}{status}"
        self._shutdown()
        return GameServerDied(f"the {self._label} {self._dead}; start a fresh sandbox{self._stderr_note()}")

    def _pump(self, deadline: float) -> None:
        try:
            self._stream.pump(deadline)
        except TimeoutError:
            raise self._died(f"did not answer within {self.timeout_s:g} s") from None
        except EOFError:
            raise self._died("exited") from None

    def _read_reply(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._stream.out:
            self._pump(deadline)
        line, _, self._stream.out = self._stream.out.partition(b"\n")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise self._died(f"wrote a line that is not protocol JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict):
            raise self._died(f"wrote a non-object reply: {line[:200]!r}")
        return reply

    def _request(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self._closed:
            raise TextGameError(f"the {self._label} was closed")
        if self._dead:
            raise GameServerDied(f"the {self._label} {self._dead} earlier; start a fresh sandbox")
        data = (json.dumps(payload, ensure_ascii=True) + "\n").encode()
        try:
            self._stream.send(data)
        except OSError:
            raise self._died("stopped reading its input") from None
        reply = self._read_reply(time.monotonic() + self.timeout_s)
        if not reply.get("ok"):
            raise TextGameError(f"{self.kind}: {reply.get('error', 'unknown error')}")
        return reply

    # ---- TextGame ------------------------------------------------------------------------------
    def reset(self, game_id: str) -> GameObs:
        return obs_from_dict(self._request({"op": "reset", "game_id": game_id})["obs"])

    def step(self, action: str) -> GameObs:
        return obs_from_dict(self._request({"op": "step", "action": action})["obs"])

    def _shutdown(self) -> None:
        self._stream.close()

    def close(self) -> None:
        if self._closed:
            return
        if not self._dead:
            try:
                self._stream.send(b'{"op": "close"}\n')
                self._read_reply(time.monotonic() + 5.0)
            except (OSError, SandboxError):
                pass  # it is going away either way
        self._closed = True
        self._shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the text-game image ------------------------------------------------------------------------

TEXTGAME_IMAGE = "swerl-textgames"
"""Repository name of the text-game image; the tag is the content hash."""

TEXTGAME_REQUIREMENTS: list[str] = [
    # ALFWorld: its PDDL domain and grammar, TextWorld's PDDL engine and what TextWorld imports
    # (jericho's spacy is only imported for Z-machine games, so it stays out)
    "alfworld==0.4.2",
    "textworld==1.7.0",
    "numpy==2.4.6",
    "tatsu==5.8.3",
    "networkx==3.6.1",
    "more-itertools==11.2.1",
    "hashids==1.3.1",
    "mementos==1.3.1",
    "termcolor==3.3.0",
    "prompt-toolkit==3.0.53",
    "wcwidth==0.9.4",
    "tqdm==4.70.1",
    # WebShop: BM25 search (on numpy, above), fuzzy matching in the reward, the Porter stemmer
    "bm25s==0.3.16",
    "rapidfuzz==3.14.6",
    "snowballstemmer==3.1.1",
    # FrozenLake (swerl/envs/games): gymnasium's FrozenLake-v1 (on numpy, above) and what gymnasium imports
    "gymnasium==1.4.0",
    "cloudpickle==3.1.3",
    "farama-notifications==0.0.6",
    "typing-extensions==4.16.0",
]
"""Binary wheels (exact pins, no dependency resolution: the list is complete) installed in the image."""

TEXTGAME_LOCAL_WHEELS: list[str] = [
    # sdists only on PyPI: built once on the host (`build_local_wheel`) and cached
    "fast-downward-textworld==20.6.4",
    "jericho==3.3.1",
]
"""Requirements built from source on the host (cached in the wheels directory) and installed too."""

TEXTGAME_SOURCES: list[str] = [
    "swerl/__init__.py",
    "swerl/structs.py",
    "swerl/envs/__init__.py",
    "swerl/envs/textgame_server.py",
    "swerl/envs/alfworld.py",
    "swerl/envs/webshop",
    "swerl/envs/games",
]
"""swerl files (or directories) copied to the image: the server and each game module."""

TEXTGAME_DATA_DIRS: list[str] = [
    "tasks/alfworld",
    "tasks/webshop",
]
"""Data directories copied to the image, at the same relative path under `TEXTGAME_ROOT`."""

TEXTGAME_WHEELS_DIR = REPO_ROOT / ".cache" / "wheels" / "textgames"
PIP_REQUIREMENT = "pip==26.3"
"""pip's own wheel, run from the wheel inside the image (the base image has no pip)."""


# pip does not widen a manylinux_2_x tag to the older ones, so every family up to bookworm's glibc is named
_PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
              "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")


def open_game(kind: str, sandbox: Any = None, **kwargs: Any) -> TextGame:
    """The game of `kind` in `sandbox` (its server, over the line protocol), or in this process when
    `sandbox` is None: what an episode factory calls with the sandbox the runner gave it."""
    return SandboxTextGame(sandbox, kind, **kwargs) if sandbox is not None else make_game(kind, **kwargs)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _split_pin(req: str) -> tuple[str, str]:
    name, sep, version = req.partition("==")
    if not sep or not version:
        raise ValueError(f"text-game requirement {req!r} must be pinned as name==version")
    return name.strip(), version.strip()


def _find_wheel(dest: Path, req: str) -> Path | None:
    name, version = _split_pin(req)
    for p in sorted(dest.glob("*.whl")):
        parts = p.name.split("-")
        if len(parts) >= 2 and _norm(parts[0]) == _norm(name) and parts[1] == version:
            return p
    return None


def build_local_wheel(req: str, dest: Path, *, log: Callable[[str], None] | None = None) -> Path:
    """Build `req` (an sdist) into a wheel in `dest`, once. The venv's bin goes first on PATH because
    some build scripts call a bare `python` (fast-downward's does), which must be this interpreter,
    not whatever `python` the machine has (a pyenv shim breaks pip's isolated build env)."""
    found = _find_wheel(dest, req)
    if found:
        return found
    dest.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"building {req} from source (a few minutes, once)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest), req],
                          capture_output=True, text=True, env=env)
    found = _find_wheel(dest, req)
    if proc.returncode != 0 or found is None:
        raise SandboxError(f"building a wheel of {req} failed (needs make, cmake and a C++ compiler):\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return found


def ensure_textgame_wheels(dest: Path = TEXTGAME_WHEELS_DIR, *,
                           log: Callable[[str], None] | None = None) -> list[Path]:
    """Every wheel the image installs, downloading (or building) the missing ones into `dest`."""
    binary = [PIP_REQUIREMENT, *TEXTGAME_REQUIREMENTS]
    missing = [r for r in binary if _find_wheel(dest, r) is None]
    if missing:
        dest.mkdir(parents=True, exist_ok=True)
        if log:
            log(f"downloading {len(missing)} wheel(s) for the text-game image")
        # the image is Debian bookworm's CPython 3.11 (glibc 2.36)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
               *[a for tag in _PLATFORMS for a in ("--platform", tag)], "-d", str(dest), *missing]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SandboxError(f"pip download failed for {missing}: {proc.stderr[-3000:]}")
    out = []
    for r in binary:
        w = _find_wheel(dest, r)
        if w is None:
            raise SandboxError(f"no wheel of {r} in {dest} after downloading it")
        out.append(w)
    out += [build_local_wheel(r, dest, log=log) for r in TEXTGAME_LOCAL_WHEELS]
    return out


def _tree(root: Path, rel: str) -> list[tuple[str, Path]]:
    p = root / rel
    if p.is_file():
        return [(rel, p)]
    if not p.is_dir():
        raise SandboxError(f"{p} is missing: the text-game image needs it (run from the swerl checkout)")
    files = []
    for d, dirs, names in os.walk(p):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for n in sorted(names):
            if n.endswith((".pyc", ".pyo")):
                continue
            f = Path(d, n)
            files.append((str(f.relative_to(root)), f))
    return files


def textgame_context(wheels: Sequence[Path], root: Path = REPO_ROOT) -> tuple[str, str, list[tuple[str, Path]]]:
    """(tag, rendered Dockerfile, [(path in the build context, host file)]) of the text-game image."""
    files = [(f"wheels/{w.name}", w) for w in sorted(wheels, key=lambda w: w.name)]
    for rel in TEXTGAME_SOURCES:
        files += [(f"src/{a}", p) for a, p in _tree(root, rel)]
    for rel in TEXTGAME_DATA_DIRS:
        files += [(f"src/{a}", p) for a, p in _tree(root, rel)]
    template = (root / "sandbox" / "textgames" / "Dockerfile").read_text()
    pip_wheel = next(w.name for w in wheels if _norm(w.name.split("-")[0]) == "pip")
    partial = dict(BASE=_base_tag(), PIP_WHEEL=pip_wheel, ROOT=TEXTGAME_ROOT, USER=TEXTGAME_USER,
                   KINDS=" ".join(sorted(GAME_KINDS)))
    h = hashlib.sha256(Template(template).safe_substitute(partial).encode())
    for arc, p in files:
        h.update(b"\0" + arc.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    digest = h.hexdigest()
    return f"{TEXTGAME_IMAGE}:{digest[:16]}", Template(template).substitute(partial, HASH=digest), files


def _base_tag() -> str:
    from swerl.sandbox.images import BASE_TAG

    return BASE_TAG


def build_textgame_image(*, client: Any = None, log: Callable[[str], None] | None = None,
                         wheels_dir: Path = TEXTGAME_WHEELS_DIR) -> str:
    """Build (or find, by content hash: an unchanged recipe costs one lookup) the one image every text
    game runs in: the base image + the game wheels installed offline + the swerl sources the server
    needs + the game data. Returns its tag."""
    import docker.errors

    from swerl.sandbox import lifecycle
    from swerl.sandbox.images import LABEL_HASH, build_from_files

    client = client or lifecycle.docker_client(timeout=600)
    wheels = ensure_textgame_wheels(wheels_dir, log=log)
    tag, dockerfile, files = textgame_context(wheels)
    digest = tag.split(":")[1]
    try:
        labels = (client.images.get(tag).attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_HASH, "").startswith(digest):
            return tag
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.get(_base_tag())
    except docker.errors.ImageNotFound:
        raise SandboxError(f"base image {_base_tag()} is missing: run `swerl sandbox build-base` first") from None
    if log:
        log(f"building {tag}")
    return build_from_files(client, tag, dockerfile, files, log=log)


# ---- the agent environment ------------------------------------------------------------------------


@dataclass(frozen=True)
class TextGamePrompt:
    """A game's wording for the agent. Templates are `str.format` strings; the fields they may use are
    listed per template."""

    system: str
    """The system message."""
    first: str
    """The first user message: {task}, {observation}, {actions}, {step}, {max_steps}."""
    step: str
    """The observation after a valid action: {observation}, {actions}, {step}, {max_steps}, {history}."""
    invalid: str
    """The feedback after an inadmissible action: {action}, {observation}, {actions}, {penalty}, {step},
    {max_steps}, {history}."""
    hidden_actions: tuple[str, ...] = ()
    """Admissible commands left out of the listed actions (still accepted), e.g. ALFWorld's `help`."""
    history_line: str = "[{step}] {action} -> {observation}"
    """One past step in {history}: {step}, {action}, {observation}."""


DEFAULT_PROMPT = TextGamePrompt(
    system=("You play a text game. Every turn, reason briefly inside <think> </think>, then give exactly one "
            "action inside <action> </action>, chosen from the admissible actions."),
    first=("Task: {task}\n\nCurrent observation:\n{observation}\n\nStep {step} of at most {max_steps}. "
           "Admissible actions: {actions}\n\nThink inside <think> </think>, then answer with one action inside "
           "<action> </action>."),
    step="{history}{observation}\n\nStep {step} of at most {max_steps}. Admissible actions: {actions}",
    invalid=("{history}\"{action}\" is not an admissible action here, so nothing happened (penalty {penalty}). "
             "Step {step} of at most {max_steps}. Admissible actions: {actions}"),
)


@dataclass(frozen=True)
class TextGameConfig:
    """Rewards and budgets of a text-game episode (verl-agent's defaults)."""

    win_reward: float = 10.0
    """Reward added when the game is won."""
    invalid_penalty: float = 0.1
    """Subtracted for every action that is not admissible (the game does not change)."""
    max_steps: int = 50
    """Actions per episode; enforced by the episode loop as EpisodeLimits.max_turns (see episode_limits)."""
    history_steps: int = 0
    """Past steps (action and the observation it got) restated before each new observation, the latest
    k before the current one; 0: the conversation itself is the history (the multi-turn loop keeps
    every earlier turn in the context)."""
    list_actions: bool = True
    """Show the admissible actions in every observation message (off: only in the first one)."""
    max_observation_chars: int = 4000
    """Longer game observations are cut to this many characters, with a marker."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"TextGameConfig.max_steps must be >= 1, got {self.max_steps}")
        if self.invalid_penalty < 0:
            raise ValueError(f"TextGameConfig.invalid_penalty is subtracted and must be >= 0, got "
                             f"{self.invalid_penalty} (use 0.1 for a penalty of -0.1)")
        if self.history_steps < 0:
            raise ValueError(f"TextGameConfig.history_steps must be >= 0, got {self.history_steps}")
        if self.max_observation_chars < 100:
            raise ValueError(f"TextGameConfig.max_observation_chars must be >= 100, got {self.max_observation_chars}")

    def episode_limits(self, base: EpisodeLimits | None = None) -> EpisodeLimits:
        """`base` (default EpisodeLimits()) with max_turns = max_steps: the episode loop truncates there."""
        return replace(base or EpisodeLimits(), max_turns=self.max_steps)


@dataclass
class _Record:
    action: str
    observation: str


@dataclass
class TextGameEnv:
    """The agent `Env` of a text game: `<action>…</action>` turns go to the game; see the module
    docstring for rewards and budgets. `last` is the game's latest observation (for reports)."""

    game: TextGame
    game_id: str
    prompt: TextGamePrompt = DEFAULT_PROMPT
    config: TextGameConfig = field(default_factory=TextGameConfig)
    action_format: ActionFormat = TAG_FORMAT
    last: GameObs | None = None
    steps: int = 0
    invalid_actions: int = 0
    total_reward: float = 0.0
    won: bool = False
    _history: list[_Record] = field(default_factory=list)

    def _cut(self, text: str) -> str:
        n = self.config.max_observation_chars
        return text if len(text) <= n else text[:n] + f"\n[... {len(text) - n} more characters cut]"

    def _actions(self, obs: GameObs) -> str:
        shown = [a for a in obs.admissible if a not in self.prompt.hidden_actions]
        return ", ".join(f"'{a}'" for a in shown) if shown else "(none)"

    def _history_text(self) -> str:
        k = self.config.history_steps
        if k == 0 or not self._history:
            return ""
        start = max(0, len(self._history) - k)
        lines = [self.prompt.history_line.format(step=start + i + 1, action=r.action, observation=r.observation)
                 for i, r in enumerate(self._history[start:])]
        return "Recent steps:\n" + "\n".join(lines) + "\n\n"

    def reset(self) -> EnvStart:
        self.steps = self.invalid_actions = 0
        self.total_reward = 0.0
        self.won = False
        self._history = []
        obs = self.game.reset(self.game_id)
        self.last = obs
        task = str(obs.info_dict().get("task", ""))
        first = self.prompt.first.format(task=task, observation=self._cut(obs.observation),
                                         actions=self._actions(obs), step=0, max_steps=self.config.max_steps)
        return EnvStart(messages=(ChatMessage("system", self.prompt.system), ChatMessage("user", first)))

    def close(self) -> None:
        """Close the game (its server, when it runs in a sandbox); the episode's figures stay readable.
        The runner calls this when the episode is over, finished or failed."""
        self.game.close()

    def step(self, turn: ParsedTurn) -> StepResult:
        if turn.malformed or not turn.tool_calls:
            raise ValueError("TextGameEnv.step needs a well-formed turn with an action; the episode answers "
                             "malformed turns itself")
        if self.last is None:
            raise ValueError("TextGameEnv.step before reset()")
        if self.last.done:
            raise ValueError(f"game {self.game_id} is over; the episode should have ended")
        if self.steps >= self.config.max_steps:
            raise ValueError(f"TextGameEnv got step {self.steps + 1} past max_steps={self.config.max_steps}: run "
                             "the episode with EpisodeLimits(max_turns=config.max_steps) (config.episode_limits())")
        action = str(json.loads(turn.tool_calls[-1].arguments_json).get("content", "")).strip()
        before = self.last
        obs = self.game.step(action)
        self.steps += 1
        listed = self._actions(obs) if self.config.list_actions else "(as listed before)"
        common = dict(actions=listed, step=self.steps, max_steps=self.config.max_steps, history=self._history_text())
        if not obs.valid:
            self.invalid_actions += 1
            self.total_reward -= self.config.invalid_penalty
            text = self.prompt.invalid.format(action=action, observation=self._cut(obs.observation),
                                              penalty=f"-{self.config.invalid_penalty:g}", **common)
            # the game is unchanged: keep its last real observation (the admissible list is the same)
            self.last = replace(before, valid=False)
            self._history.append(_Record(action, obs.observation))
            return StepResult(observation=text, reward=self.total_reward, error=True)
        self.last = obs
        self._history.append(_Record(action, obs.observation))
        if obs.won and not self.won:
            self.won = True
            self.total_reward += self.config.win_reward
        text = self.prompt.step.format(observation=self._cut(obs.observation), **common)
        if obs.done:
            return StepResult(observation=self._cut(obs.observation), terminated=True, reward=self.total_reward,
                              reason="won" if obs.won else "lost")
        return StepResult(observation=text, reward=self.total_reward)


def scripted_turn(action: str, thought: str = "", tag: str = "action") -> str:
    """A model turn that plays `action` (what scripted policies, demos and tests emit), written the way
    Qwen's template renders a turn in history, so the token-exact trajectory shows no drift. `tag`: the
    action tag the game's format takes (`answer` for the puzzle games)."""
    head = f"<think>\n{thought.strip()}\n</think>\n\n" if thought.strip() else ""
    return f"{head}<{tag}>{action}</{tag}>"


class ExpertPlans(dict[str, list[str]]):
    """Expert plans keyed as `ExpertEngine` wants them, with the action tag their games take (an
    `ExpertEngine` given these plays them in that tag unless told another)."""

    def __init__(self, plans: dict[str, list[str]] | None = None, *, tag: str = "action") -> None:
        super().__init__(plans or {})
        self.tag = tag


class ExpertEngine:
    """A scripted policy for text games, not a model: plays each game's expert plan. It finds the game
    from the prompt (every plan is keyed by a text that occurs only in its game's opening messages,
    e.g. the game's first observation) and the step from the number of model turns so far, so one
    engine serves many concurrent episodes, as a model does. Answers end with the end-of-turn token;
    logprobs are 0. `tag`: the action tag of its turns (default: the plans' own, see `ExpertPlans`,
    else `action`)."""

    def __init__(self, tokenizer: Any, plans: dict[str, Sequence[str]], *,
                 turn_marker: str = "<|im_start|>assistant", tag: str | None = None) -> None:
        if not plans:
            raise ValueError("ExpertEngine needs at least one plan")
        self.tag = tag or getattr(plans, "tag", "action")
        self.tokenizer = tokenizer
        self.plans = {key: list(plan) for key, plan in plans.items()}
        self.turn_marker = turn_marker
        self.end_id = tokenizer.eos_token_id

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        from swerl.structs import Generation

        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        keys = [key for key in self.plans if key in text]
        if len(keys) != 1:
            raise RuntimeError(f"ExpertEngine: the prompt matches {len(keys)} of its {len(self.plans)} plans; "
                               "each plan's key must occur in exactly one game's prompt")
        turn = text.count(self.turn_marker) - 1  # the generation prompt opens the current turn
        if turn < 0:
            raise RuntimeError(f"ExpertEngine: no {self.turn_marker!r} in the prompt; pass the template's marker")
        plan = self.plans[keys[0]]
        action = plan[turn] if turn < len(plan) else "look"
        ids = [*self.tokenizer(scripted_turn(action, tag=self.tag), add_special_tokens=False)["input_ids"],
               self.end_id]
        ids = ids[:params.max_new_tokens]
        finish = "stop" if ids[-1] == self.end_id else "length"
        return Generation(token_ids=tuple(ids), logprobs=(0.0,) * len(ids), finish_reason=finish)

    async def close(self) -> None:
        return None


__all__ = [
    "DEFAULT_PROMPT",
    "GAME_KINDS",
    "TEXTGAME_DATA_DIRS",
    "TEXTGAME_LOCAL_WHEELS",
    "TEXTGAME_REQUIREMENTS",
    "TEXTGAME_SOURCES",
    "ExpertEngine",
    "ExpertPlans",
    "GameServerDied",
    "SandboxTextGame",
    "TextGame",
    "TextGameConfig",
    "TextGameEnv",
    "TextGameError",
    "TextGamePrompt",
    "build_textgame_image",
    "ensure_textgame_wheels",
    "make_game",
    "scripted_turn",
]
