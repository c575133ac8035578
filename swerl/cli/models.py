"""`swerl models`: the real pretrained models that ship inside PyPI packages (`swerl.models.shipped`):
list them, and import one into an HF directory a config can name."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def _list(args: argparse.Namespace) -> int:
    from swerl.models.shipped import SHIPPED, imported_dir, is_imported

    for m in SHIPPED.values():
        where = imported_dir(m.name)
        state = f"imported: {where}" if is_imported(where) else "not imported yet"
        print(f"{m.name}: {m.source} as {m.quantization} GGUF in PyPI's {m.requirement} ({m.license}); "
              f"{state}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from swerl.models.shipped import MARKER, import_model

    t0 = time.perf_counter()
    out = import_model(args.name, gguf=args.gguf, out=args.out, force=args.force,
                       log=None if args.quiet else print)
    rec = json.loads((out / MARKER).read_text())
    took = time.perf_counter() - t0
    print(f"{args.name}: {out} ({rec['architecture']}, {rec['parameters'] / 1e6:.1f}M parameters, "
          f"{rec['dtype']} from {rec.get('quantization', 'GGUF')}; {took:.1f} s) — use it as "
          f"model.path={args.name} or --model {out}")
    return 0


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """`swerl models` and its subcommands, on the root parser's subcommands `sub`."""
    mo = sub.add_parser("models", help="real pretrained models shipped in PyPI packages: list, import")
    ms = mo.add_subparsers(dest="models_command", required=True)
    ls = ms.add_parser("list", help="the shipped models and where they are imported")
    ls.set_defaults(fn=_list)
    im = ms.add_parser("import", help="import a shipped model into an HF directory (safetensors, tokenizer, "
                                      "chat template), once; dequantized to float32")
    im.add_argument("name", help="the model's name (see `swerl models list`)")
    im.add_argument("--gguf", help="read this GGUF file instead of the package's")
    im.add_argument("--out", help="the directory to write (default: the model cache, $SWERL_MODEL_CACHE or "
                                  "~/.cache/swerl/models/NAME)")
    im.add_argument("--force", action="store_true", help="import again even if it is there")
    im.add_argument("--quiet", action="store_true", help="only the result line")
    im.set_defaults(fn=_import)
