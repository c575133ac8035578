"""The strict SGLang double as a server process of its own, for tests that put it on another network host
(`swerl.cluster.onebox.netns_node`): it listens on `--host`, writes its URL to `--url-file` once it
serves, and serves until SIGTERM.

    python tests/rollout/fakes/serve_sglang.py --model DIR --host 10.77.0.2 --url-file F [--release 0.5.21]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main() -> None:
    from fakes.fake_sglang import FakeSGLangServer
    from swerl.agent import load_tokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--url-file", required=True)
    ap.add_argument("--release", default="0.5.21")
    a = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakeSGLangServer(a.model, tokenizer=load_tokenizer(), release=a.release, host=a.host) as fake:
        tmp = a.url_file + ".tmp"
        Path(tmp).write_text(fake.url)
        os.replace(tmp, a.url_file)
        stop.wait()


if __name__ == "__main__":
    main()
