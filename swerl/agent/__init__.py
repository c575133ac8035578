"""The agent: sandbox tools, model-output format, and the multi-turn episode → token-exact Trajectory.

May import only `swerl.sandbox`, `swerl.structs`, transformers/tokenizers and the standard library.
"""

from swerl.agent.engine import Engine, ScriptedEngine
from swerl.agent.env import DEFAULT_SYSTEM_PROMPT, Env, ToolEnv
from swerl.agent.episode import run_episode
from swerl.agent.format import (
    TAG_FORMAT,
    TOOL_CALL_FORMAT,
    Drift,
    ObservationFrame,
    format_help,
    measure_drift,
    observation_frame,
    parse_turn,
    render,
    token_char_spans,
    tool_call_text,
)
from swerl.agent.tokenizer import check_tool_template, default_tokenizer_dir, load_tokenizer
from swerl.agent.tools import SandboxTools, tool_specs

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "TAG_FORMAT",
    "TOOL_CALL_FORMAT",
    "Drift",
    "Engine",
    "Env",
    "ObservationFrame",
    "SandboxTools",
    "ScriptedEngine",
    "ToolEnv",
    "check_tool_template",
    "default_tokenizer_dir",
    "format_help",
    "load_tokenizer",
    "measure_drift",
    "observation_frame",
    "parse_turn",
    "render",
    "run_episode",
    "token_char_spans",
    "tool_call_text",
    "tool_specs",
]
