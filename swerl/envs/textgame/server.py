"""The text-game line protocol: a game process that reads one JSON request per line on stdin and
writes one JSON reply per line on stdout. It runs inside the text-game sandbox image, where only the
standard library, `swerl.structs` and the game's own module (and its libraries) are installed, so
this module imports nothing from swerl but `swerl.structs` and `swerl.envs.textgame.protocol`.

    python3 -m swerl.envs.textgame.server KIND '<json kwargs>'

`KIND` names an entry of `protocol.GAME_KINDS` (kind → "module:Class"); the class is constructed with
the JSON-decoded keyword arguments, exactly as `protocol.make_game` does in-process.

Requests and replies (one line each, UTF-8 JSON; newlines inside strings are escaped by JSON):

    {"op": "reset", "game_id": "..."}      → {"ok": true, "obs": {GameObs fields}}
    {"op": "step", "action": "..."}         → {"ok": true, "obs": {GameObs fields}}
    {"op": "close"}                         → {"ok": true}            (then the process exits)
    anything that fails                     → {"ok": false, "error": "Type: message"}

The server first writes a ready line, `{"ok": true, "ready": KIND}` (or an error reply and exit
status 2 when the game cannot be constructed), so the host knows the game loaded before sending
requests. Whatever the game prints goes to stderr, never into the protocol stream.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from swerl.envs.textgame.protocol import game_class, obs_to_dict


def _reply(out: TextIO, payload: dict[str, Any]) -> None:
    # ensure_ascii: the stream stays 7-bit whatever the locale of the container's Python is
    out.write(json.dumps(payload, ensure_ascii=True) + "\n")
    out.flush()


def _handle(game: Any, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "reset":
        gid = req.get("game_id")
        if not isinstance(gid, str):
            raise ValueError("reset needs a string game_id")
        return {"ok": True, "obs": obs_to_dict(game.reset(gid))}
    if op == "step":
        action = req.get("action")
        if not isinstance(action, str):
            raise ValueError("step needs a string action")
        return {"ok": True, "obs": obs_to_dict(game.step(action))}
    raise ValueError(f"unknown op {op!r} (reset, step or close)")


def serve(kind: str, kwargs: dict[str, Any], stdin: TextIO, stdout: TextIO) -> int:
    """Run the protocol until `close` or end of input; returns the exit status."""
    try:
        game = game_class(kind)(**kwargs)
    except Exception as e:
        _reply(stdout, {"ok": False, "error": f"cannot start game {kind!r}: {type(e).__name__}: {e}"})
        return 2
    _reply(stdout, {"ok": True, "ready": kind})
    try:
        for line in stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("a request must be a JSON object")
                if req.get("op") == "close":
                    _reply(stdout, {"ok": True})
                    return 0
                reply = _handle(game, req)
            except Exception as e:  # a failing request is answered, the server goes on
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            _reply(stdout, reply)
        return 0
    finally:
        game.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python3 -m swerl.envs.textgame.server KIND ['<json kwargs>']", file=sys.stderr)
        return 2
    kwargs = json.loads(args[1]) if len(args) == 2 else {}
    if not isinstance(kwargs, dict):
        print("the game's keyword arguments must be a JSON object", file=sys.stderr)
        return 2
    # The protocol owns the real stdout; anything the game (or its libraries) prints goes to stderr.
    proto = sys.stdout
    sys.stdout = sys.stderr
    stdin = open(sys.stdin.fileno(), encoding="utf-8", newline="\n", closefd=False)  # noqa: SIM115 (the process's stdin)
    out = open(proto.fileno(), "w", encoding="utf-8", newline="\n", closefd=False)  # noqa: SIM115
    return serve(args[0], kwargs, stdin, out)


if __name__ == "__main__":
    sys.exit(main())
