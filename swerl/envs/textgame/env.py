"""The agent environment of a text game: `TextGameEnv` sends `<action>…</action>` turns to a `TextGame`
(in this process or sandboxed), with the game's wording (`TextGamePrompt`) and rewards and budgets
(`TextGameConfig`; see the package docstring).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from swerl.agent.format import TAG_FORMAT, ActionFormat
from swerl.envs.textgame.protocol import TextGame
from swerl.structs import ChatMessage, EnvStart, EpisodeLimits, GameObs, ParsedTurn, StepResult


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
           "Admissible actions: {actions}\n\nThink inside <think> </think>, then answer with one action "
           "inside <action> </action>."),
    step="{history}{observation}\n\nStep {step} of at most {max_steps}. Admissible actions: {actions}",
    invalid=("{history}\"{action}\" is not an admissible action here, so nothing happened (penalty "
             "{penalty}). Step {step} of at most {max_steps}. Admissible actions: {actions}"),
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
            raise ValueError("TextGameConfig.max_observation_chars must be >= 100, got "
                             f"{self.max_observation_chars}")

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
    package docstring for rewards and budgets. `last` is the game's latest observation (for reports)."""

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
        lines = [self.prompt.history_line.format(step=start + i + 1, action=r.action,
                                                 observation=r.observation)
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
            raise ValueError(f"TextGameEnv got step {self.steps + 1} past max_steps={self.config.max_steps}: "
                             "run the episode with EpisodeLimits(max_turns=config.max_steps) "
                             "(config.episode_limits())")
        action = str(json.loads(turn.tool_calls[-1].arguments_json).get("content", "")).strip()
        before = self.last
        obs = self.game.step(action)
        self.steps += 1
        listed = self._actions(obs) if self.config.list_actions else "(as listed before)"
        common = dict(actions=listed, step=self.steps, max_steps=self.config.max_steps,
                      history=self._history_text())
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
            return StepResult(observation=self._cut(obs.observation), terminated=True,
                              reward=self.total_reward, reason="won" if obs.won else "lost")
        return StepResult(observation=text, reward=self.total_reward)
