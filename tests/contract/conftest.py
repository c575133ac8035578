"""What the contract suites run over, each written in one place: the engine kinds (`engine`), the
environment kinds (`ENV_KINDS`) and the sandbox backends (`SANDBOX_BACKENDS`). A new backend is one
more entry here, and every contract test then runs on it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from contract.engine_reference import (
    GREEDY_STEPS,
    STOP_STEP,
    Reference,
    build_reference,
    comparable_prefix,
    load_fp32,
    make_conformance_model,
    open_engine,
)
from swerl.agent import Env
from swerl.sandbox import Sandbox
from swerl.structs import StepResult

# ---- engines ----------------------------------------------------------------------------------------

ENGINE_KINDS = ("hf", "vllm", "sglang")


@pytest.fixture(scope="module")
def conformance_dir(tok) -> Path:
    return make_conformance_model(tok)


@pytest.fixture(scope="module")
def ref_model(conformance_dir):
    """An fp32 transformers copy for greedy and teacher-forced references."""
    return load_fp32(conformance_dir)


@pytest.fixture(scope="module")
def learner_model(conformance_dir):
    """The policy as the learner loads it (fp32 on CPU), used only through `sequence_stats`."""
    return load_fp32(conformance_dir)


@pytest.fixture(scope="module")
def ref(tok, ref_model, conformance_dir) -> Reference:
    r = build_reference(tok, ref_model, conformance_dir)
    # the checkpoint does what the suite relies on (test_engine.py docstring)
    assert r.greedy[STOP_STEP] == r.eot and r.eot not in r.greedy[:STOP_STEP], r.greedy
    assert r.eot not in r.long_greedy, r.long_greedy
    assert comparable_prefix(r.greedy_margins) == GREEDY_STEPS, r.greedy_margins
    assert comparable_prefix(r.long_margins) == GREEDY_STEPS, r.long_margins
    return r


@pytest.fixture(scope="module", params=[
    "hf", pytest.param("vllm", marks=(pytest.mark.vllm, pytest.mark.slow)), "sglang"])
def engine(request, conformance_dir, tok, tmp_path_factory):
    """(kind, engine): one started engine per kind for the whole module (one vLLM server start)."""
    kind = request.param
    assert kind in ENGINE_KINDS
    try:
        cm = open_engine(kind, conformance_dir, tok, log_dir=tmp_path_factory.mktemp(f"engine-{kind}"))
        eng = cm.__enter__()
    except FileNotFoundError as e:
        pytest.fail(str(e))
    try:
        yield kind, eng
    finally:
        cm.__exit__(None, None, None)


# ---- environments -----------------------------------------------------------------------------------
#
# One factory per env kind that runs here. Each takes the test's ExitStack (for what must be released
# afterwards: sandboxes) and returns an `EnvCase`: how to make fresh envs of one task, a script that
# finishes it with what the finish must show, and a script that spends the env's turn budget without
# finishing. Envs are built through their public constructors, not a registry, so that the contract
# checks the classes themselves; when the env registry lands, these are what it must reproduce.


@dataclass(frozen=True)
class EnvCase:
    kind: str
    make_env: Callable[[], Env]
    """A fresh env of the same task (and seed) on every call."""
    finish: tuple[str, ...]
    """Model turns that end the task (the last one terminates)."""
    finish_reason: str
    finish_reward: float
    """The reward the finishing step reports, known from the task's rules, not from the env."""
    finished: Callable[[StepResult], bool] | None
    """An independent sign that `finish` really solved the task, read from what the env showed (None:
    nothing shown tells)."""
    unfinished: tuple[str, ...]
    """As many turns as the env's budget allows, none of which ends the task."""
    unfinished_rewards: tuple[float | None, ...]
    """The reward each of those steps reports."""
    after_done: Literal["raises", "allowed"] = "raises"
    before_reset: Literal["raises", "allowed"] = "raises"
    reset_restarts: bool = True
    released: Callable[[Env], bool] | None = None
    """After close(): whether the env let go of what it held (None: it holds nothing of its own)."""


def _answers(actions: Sequence[str], tag: str) -> tuple[str, ...]:
    from swerl.envs.textgame.expert import scripted_turn

    return tuple(scripted_turn(a, thought="next move", tag=tag) for a in actions)


def _penalties(n: int, penalty: float) -> tuple[float, ...]:
    # TextGameEnv reports the episode's running total; each invalid action costs `penalty`
    total, out = 0.0, []
    for _ in range(n):
        total -= penalty
        out.append(total)
    return tuple(out)


def _puzzle(kind: str, finished: Callable[[StepResult], bool]) -> Callable[[ExitStack], EnvCase]:
    """Game `heldout-00000` of a puzzle kind, finished by the game's own expert."""
    def case(stack: ExitStack) -> EnvCase:
        from swerl.envs.games.env import PUZZLES, PuzzleEnv, expert_actions, make_puzzle

        spec = PUZZLES[kind]
        game_id = "heldout-00000"
        plan = expert_actions(make_puzzle(kind), game_id)
        cfg = spec.config
        return EnvCase(
            kind=kind, make_env=lambda: PuzzleEnv(make_puzzle(kind), game_id, spec.prompt, cfg),
            finish=_answers(plan, "answer"), finish_reason="won", finish_reward=cfg.win_reward,
            finished=finished,
            unfinished=_answers(["Jump"] * cfg.max_steps, "answer"),
            unfinished_rewards=_penalties(cfg.max_steps, cfg.invalid_penalty))
    return case


def _board(step: StepResult) -> str:
    """The puzzle as drawn after the last move (the observation's first line says what the move did)."""
    return step.observation.split("\n", 1)[1]


def _sokoban_solved(step: StepResult) -> bool:
    # the prompt's legend: X a box off target, O an empty target, S the player on a target
    return not set(_board(step)) & {"X", "O", "S"} and "√" in _board(step)


def _sudoku_solved(step: StepResult) -> bool:
    """Every row, column and box holds each value once, read off the drawn grid (rows ` 1  1 4 | 2 3`)."""
    rows = [[int(c) for c in line.split()[1:] if c.isdigit()] for line in _board(step).splitlines()
            if line.strip()[:1].isdigit() and "|" in line]
    n = len(rows)
    box = int(n ** 0.5)
    full = set(range(1, n + 1))
    groups = rows + [list(c) for c in zip(*rows, strict=True)] + [
        [rows[r][c] for r in range(br, br + box) for c in range(bc, bc + box)]
        for br in range(0, n, box) for bc in range(0, n, box)]
    return n >= 4 and all(len(g) == n and set(g) == full for g in groups)


def sokoban_sandboxed(stack: ExitStack) -> EnvCase:
    """Sokoban as training plays it: its game server in a sandbox of the text-game image, one per env."""
    from swerl.envs.games.env import PUZZLES, PuzzleEnv, expert_actions, make_puzzle
    from swerl.envs.textgame.client import SandboxTextGame
    from swerl.envs.textgame.image import build_textgame_image
    from swerl.sandbox import DockerSandbox, SandboxSpec

    image = build_textgame_image()
    spec, game_id = PUZZLES["sokoban"], "heldout-00000"
    plan = expert_actions(make_puzzle("sokoban"), game_id)  # in process: the server must play it the same

    def make_env() -> PuzzleEnv:
        sb = stack.enter_context(DockerSandbox(SandboxSpec(image=image)))
        return PuzzleEnv(SandboxTextGame(sb, "sokoban"), game_id, spec.prompt, spec.config)

    def server_gone(env: Env) -> bool:
        game = env.game  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while game._api.exec_inspect(game._exec_id)["Running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        return not game._api.exec_inspect(game._exec_id)["Running"]  # Docker's word on the server process

    return dataclasses.replace(
        _puzzle("sokoban", _sokoban_solved)(stack), kind="sokoban-sandboxed", make_env=make_env,
        finish=_answers(plan, "answer"), released=server_gone)


def alfworld(stack: ExitStack) -> EnvCase:
    from swerl.envs.alfworld import list_games, walkthrough
    from swerl.envs.alfworld.env import ALFWORLD_PROMPT
    from swerl.envs.textgame.env import TextGameConfig, TextGameEnv
    from swerl.envs.textgame.protocol import make_game

    game_id = list_games(None, "heldout")[0]
    plan = walkthrough(None, game_id)
    cfg = TextGameConfig(max_steps=len(plan) + 2)  # the default 50 would only make the open script slow
    return EnvCase(
        kind="alfworld", make_env=lambda: TextGameEnv(make_game("alfworld"), game_id, ALFWORLD_PROMPT, cfg),
        finish=_answers(plan, "action"), finish_reason="won", finish_reward=cfg.win_reward,
        finished=None,  # its win is the PDDL goal, seen only through the game's `won` (reason, reward)
        unfinished=_answers(["levitate to the ceiling"] * cfg.max_steps, "action"),
        unfinished_rewards=_penalties(cfg.max_steps, cfg.invalid_penalty),
        released=lambda env: env.game._env is None)  # type: ignore[attr-defined]  # its TextWorld env


def webshop(stack: ExitStack) -> EnvCase:
    from swerl.envs.textgame.protocol import make_game
    from swerl.envs.webshop.env import GAME_KWARGS, WEBSHOP_CONFIG, WebShopEnv, list_games
    from swerl.envs.webshop.expert import expert_actions

    goal_id = list_games()[0]
    plan = expert_actions(make_game("webshop", **GAME_KWARGS), goal_id)
    cfg = WEBSHOP_CONFIG
    return EnvCase(
        kind="webshop", make_env=lambda: WebShopEnv(make_game("webshop", **GAME_KWARGS), goal_id),
        # the expert buys the goal's own product with its options: WebShop's score 1.0, x score_scale 10
        finish=_answers(plan, "action"), finish_reason="won", finish_reward=10.0 * 1.0 + cfg.win_reward,
        # WebShop's done page: its thanks, then the score (swerl/envs/webshop/pages.py, as WebShop's own)
        finished=lambda s: ("Thank you for shopping with us!" in s.observation
                            and s.observation.endswith("[SEP] 1.0")),
        unfinished=_answers(["click[a button that is not there]"] * cfg.max_steps, "action"),
        unfinished_rewards=_penalties(cfg.max_steps, cfg.invalid_penalty),
        released=lambda env: env.game._s is None)  # type: ignore[attr-defined]  # its shopping session


def swe(stack: ExitStack) -> EnvCase:
    from swe_fixtures import SUITE, pick

    from swerl.agent import tool_call_text as call
    from swerl.envs.swe import SWEEnv
    from swerl.envs.swe.images import resolve_image
    from swerl.envs.swe.instances import load_instances
    from swerl.sandbox import DockerSandbox, SandboxSpec

    inst = pick(load_instances(SUITE), "inflection")
    image = resolve_image(inst)

    def make_env() -> SWEEnv:
        # the runner's part: one fresh sandbox per episode, released after it
        sb = stack.enter_context(DockerSandbox(SandboxSpec(image=image)))
        return SWEEnv(sb, inst, image=image)

    apply = call("bash", {"command": f"cd /testbed && git apply - <<'SWERL_EOF'\n{inst.patch}SWERL_EOF"})
    def files(patch: str) -> list[str]:
        return sorted(line.split(" b/")[-1] for line in patch.splitlines() if line.startswith("diff --git"))

    return EnvCase(
        kind="swe", make_env=make_env,
        # the gold patch resolves the instance (SWE-bench's verdict on its own fix): reward 1.0
        finish=(apply, call("submit")), finish_reason="submit", finish_reward=1.0,
        finished=lambda s: s.result is not None and files(s.result) == files(inst.patch),
        unfinished=(call("bash", {"command": "cd /testbed && git status --short && echo clean"}),
                    call("bash", {"command": "printf 'a\\nb\\n' > /tmp/notes && wc -l < /tmp/notes"})),
        unfinished_rewards=(None, None),
        # one episode per sandbox (a sandbox is never reused): a second reset raises rather than start
        # over on a repository that holds the last episode's work
        reset_restarts=False)


ENV_KINDS = [
    pytest.param(_puzzle("sokoban", _sokoban_solved), id="sokoban"),
    pytest.param(_puzzle("frozenlake", lambda s: "√" in _board(s)), id="frozenlake"),
    pytest.param(_puzzle("sudoku", _sudoku_solved), id="sudoku"),
    pytest.param(sokoban_sandboxed, id="sokoban-sandboxed", marks=(pytest.mark.docker, pytest.mark.slow)),
    pytest.param(alfworld, id="alfworld"),
    pytest.param(webshop, id="webshop"),
    pytest.param(swe, id="swe", marks=(pytest.mark.docker, pytest.mark.slow)),
]
"""Every env kind that runs here: in process, or in Docker (swe; sokoban with its game server in a
sandbox). The toy game is not an `Env` (it plays token ids without a chat template, swerl/envs/toy/):
`toy_game` below is its one import, and tests/contract/test_env.py checks the same ending and
determinism rules on its episodes."""


@pytest.fixture(params=ENV_KINDS)
def env_case(request) -> Iterator[EnvCase]:
    with ExitStack() as stack:
        yield request.param(stack)


@pytest.fixture
def toy_game() -> Any:
    """The toy game's module (the one place the contract suite imports it from)."""
    from swerl.envs import toy

    return toy


# ---- sandboxes --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxBackend:
    name: str
    make: Callable[..., Sandbox]
    """An unstarted sandbox; keyword arguments override SandboxSpec fields."""
    user: str
    """Who its commands run as (the base image's `swerl.user` label is `swerl`)."""
    git: bool
    """Whether its workdir is a git repository at start (diff() needs a base)."""
    alive: Callable[[Sandbox], bool]
    """Whether what it started still exists on the host."""


def _container_exists(sb: Sandbox) -> bool:
    import docker

    try:
        docker.from_env().containers.get(sb.id)  # type: ignore[attr-defined]
    except docker.errors.NotFound:
        return False
    return True


def _docker(image_fixture: str, **fixed: Any) -> Callable[[pytest.FixtureRequest], Callable[..., Sandbox]]:
    def make(request: pytest.FixtureRequest) -> Callable[..., Sandbox]:
        from swerl.sandbox import DockerSandbox, SandboxSpec

        image = request.getfixturevalue(image_fixture)
        return lambda **kw: DockerSandbox(SandboxSpec(image=image, **{"memory": "512m", **fixed, **kw}))
    return make


SANDBOX_BACKENDS = [
    pytest.param(("docker", _docker("base_image"), "swerl", False), id="docker"),
    pytest.param(("docker-root", _docker("base_image", user="root"), "root", False), id="docker-root"),
    pytest.param(("docker-task", _docker("task_image"), "swerl", True), id="docker-task"),
]
"""Every Sandbox implementation (DockerSandbox is the only one), as the agent meets it: the base image
as its non-root user and as root, and a task image whose /testbed is a repository."""


@pytest.fixture(params=SANDBOX_BACKENDS)
def sandbox_backend(request) -> SandboxBackend:
    name, docker_backend, user, git = request.param
    return SandboxBackend(name=name, make=docker_backend(request), user=user, git=git,
                          alive=_container_exists)


@pytest.fixture
def sb(sandbox_backend) -> Iterator[Sandbox]:
    """A started sandbox of the backend, output capped at 4096 bytes (closed afterwards)."""
    with sandbox_backend.make(output_limit=4096) as box:
        yield box
