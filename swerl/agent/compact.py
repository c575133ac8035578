"""A compact vocabulary: a tokenizer over the few thousand ids of another tokenizer that a task's texts
actually use, renumbered 0..K-1, so a tiny model's output layer has K rows instead of 151,936.

Why: a random-init CPU model with the real Qwen vocabulary spends ~97% of its compute in the output
layer (hidden 128: 19.4M of 19.9M multiply-adds per token), which makes an RL experiment on 2 cores
take hours. Text still goes through the real Qwen tokenizer (the same BPE pieces, the same chat
template); only the id space shrinks. The subset holds the 256 single-byte tokens, so a piece it lacks
is spelled out byte by byte when text is encoded: every text round-trips. `to_compact` (renumbering
existing base-id sequences one for one) maps an id outside the subset to `unk_token_id`, a reserved
row that decodes to nothing.

`CompactTokenizer.save_pretrained` writes the base tokenizer's files plus `swerl_compact_vocab.json`;
`swerl.agent.load_tokenizer` on such a directory returns the compact tokenizer again. Only the
in-process hf engine can serve such a model (a server would tokenize with the base ids).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from swerl.files import atomic_write

COMPACT_FILE = "swerl_compact_vocab.json"
"""Written beside the base tokenizer's files: the base ids the compact ids stand for, in order."""


class CompactTokenizer:
    """The tokenizer surface swerl uses (`__call__`, `encode`, `decode`, `apply_chat_template`, the
    id/token conversions, the special ids, `save_pretrained`), over a subset of `base`'s ids.

    Compact id 0 is the unknown row; ids 1..K-1 are `base_ids` in order. There is deliberately no
    fallback to the base tokenizer's other attributes: one returning base ids would be silently wrong.
    """

    def __init__(self, base: Any, base_ids: Sequence[int]) -> None:
        ids = list(dict.fromkeys(int(i) for i in base_ids))
        for special in (base.eos_token_id, base.pad_token_id, base.bos_token_id):
            if special is not None and special not in ids:
                ids.append(special)  # the end of turn and padding must exist in any subset
        self.base = base
        self.base_ids: tuple[int, ...] = tuple(ids)
        self.unk_token_id = 0
        self._to_compact = {b: i + 1 for i, b in enumerate(ids)}
        self._to_base = [None, *ids]

    # ---- id maps ----------------------------------------------------------------------------------

    def to_compact(self, ids: Iterable[int]) -> list[int]:
        """Base ids → compact ids (unknown ones → `unk_token_id`)."""
        return [self._to_compact.get(int(i), 0) for i in ids]

    def to_base(self, ids: Iterable[int]) -> list[int]:
        """Compact ids → base ids; the unknown row is dropped (it stands for no known text)."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._to_base):
                raise ValueError(f"token id {i} is outside the compact vocabulary of {len(self)} ids")
            if i:
                out.append(self._to_base[i])
        return out

    def _one(self, base_id: int | None) -> int | None:
        return None if base_id is None else self._to_compact.get(base_id, 0)

    # ---- the tokenizer surface --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._to_base)

    def _encode_ids(self, base_ids: Sequence[int]) -> list[int]:
        # a piece outside the subset is spelled out in its single-byte tokens (all in the subset for a
        # byte-level BPE), so text round-trips exactly; only a non-byte-level tokenizer yields unknowns
        out: list[int] = []
        for b in base_ids:
            c = self._to_compact.get(int(b))
            if c is not None:
                out.append(c)
                continue
            piece = self.base.convert_ids_to_tokens(int(b)) or ""
            out.extend(self._to_compact.get(self.base.convert_tokens_to_ids(ch), 0) for ch in piece)
        return out

    def __call__(self, text: str | list[str], **kwargs: Any) -> dict[str, Any]:
        enc = self.base(text, **kwargs)
        ids = enc["input_ids"]
        mapped = ([self._encode_ids(x) for x in ids] if ids and isinstance(ids[0], list)
                  else self._encode_ids(ids))
        return {"input_ids": mapped}

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return self._encode_ids(self.base.encode(text, **kwargs))

    def decode(self, ids: Iterable[int], **kwargs: Any) -> str:
        return self.base.decode(self.to_base(ids), **kwargs)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> Any:
        if isinstance(ids, int):
            return self.base.convert_ids_to_tokens(self._to_base[ids]) if ids else None
        return [self.base.convert_ids_to_tokens(self._to_base[i]) if i else None for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        if isinstance(tokens, str):
            return self._one(self.base.convert_tokens_to_ids(tokens))
        return [self._one(t) for t in self.base.convert_tokens_to_ids(list(tokens))]

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        out = self.base.apply_chat_template(*args, **kwargs)
        if kwargs.get("tokenize", True) is False:
            return out
        if isinstance(out, Mapping):
            return {**out, "input_ids": self._encode_ids(out["input_ids"])}
        return self._encode_ids(out)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return {self._to_compact[b]: t for b, t in self.base.added_tokens_decoder.items()
                if b in self._to_compact}

    @property
    def chat_template(self) -> Any:
        return self.base.chat_template

    @property
    def eos_token(self) -> str | None:
        return self.base.eos_token

    @property
    def pad_token(self) -> str | None:
        return self.base.pad_token

    @property
    def eos_token_id(self) -> int | None:
        return self._one(self.base.eos_token_id)

    @property
    def pad_token_id(self) -> int | None:
        return self._one(self.base.pad_token_id)

    @property
    def bos_token_id(self) -> int | None:
        return self._one(self.base.bos_token_id)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        self.base.save_pretrained(directory)
        atomic_write(Path(directory) / COMPACT_FILE, json.dumps({"base_ids": list(self.base_ids)}))


def compact_vocabulary(base: Any, token_id_lists: Iterable[Sequence[int]]) -> CompactTokenizer:
    """A compact tokenizer over every id in `token_id_lists` (base ids, e.g. demonstration trajectories)
    in order of first use, then the base's added tokens (chat markup) and its 256 single-byte tokens,
    so that any text still encodes (spelled out byte by byte where its pieces are not in the subset)."""
    from swerl.agent.format import _byte_decoder

    seen: dict[int, None] = {}
    for ids in token_id_lists:
        seen.update(dict.fromkeys(int(i) for i in ids))
    extra = sorted(base.added_tokens_decoder)
    byte_ids = [i for i in base.convert_tokens_to_ids(list(_byte_decoder())) if i is not None]
    return CompactTokenizer(base, [*seen, *extra, *byte_ids])


def load_compact(directory: str | os.PathLike[str], base: Any) -> CompactTokenizer | None:
    """The compact tokenizer saved in `directory` over `base` (loaded from the same directory), or None
    when the directory holds no compact vocabulary."""
    path = Path(directory) / COMPACT_FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["base_ids"]
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"{path} is not a compact vocabulary ({e}); delete it or re-run `swerl sft`"
                           ) from e
    return CompactTokenizer(base, ids)
