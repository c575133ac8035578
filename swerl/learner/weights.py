"""The learner's weights as a stream of buckets, for weight sync in memory (`rollout.weight_sync:
memory`): the policy is read one module at a time (under ZeRO-3 each module gathered, copied and
released before the next) and packed into buckets of at most `bucket_bytes`, so neither the learner
nor a rollout engine ever holds the whole model a second time.

A tensor larger than the bucket travels alone in a bucket of its own: it is one weight, gathered
whole under ZeRO-3 anyway, and the servers' update calls take whole tensors (SGLang's
`update_weights_from_distributed`, vLLM's `update_weights` name each tensor with its full shape).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

MIB = 1 << 20


@dataclass(frozen=True)
class WeightMeta:
    """One weight as a receiver allocates it: plain transformers name, dtype, full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class WeightBucket:
    """Consecutive weights of the policy, together at most the bucket size (or one larger weight)."""

    names: tuple[str, ...]
    tensors: tuple[Tensor, ...]
    index: int
    """Position of the bucket in the stream (0 first)."""
    last: bool
    """No bucket follows (a receiver finishes its update, flushes its cache, after this one)."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def meta(self) -> tuple[WeightMeta, ...]:
        return tuple(WeightMeta(n, t.dtype, tuple(t.shape)) for n, t in zip(self.names, self.tensors,
                                                                              strict=True))

    def flattened(self) -> Tensor:
        """The bucket as one uint8 tensor, each weight's bytes in `names` order: SGLang's
        `FlattenedTensorBucket` layout (sglang 0.5.21 `srt/weight_sync/tensor_bucket.py` l. 40-62),
        which its `load_format: flattened_bucket` receive rebuilds (`srt/model_executor/
        model_runner_components/weight_updater.py` l. 288-306): one broadcast per bucket."""
        return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in self.tensors])


def check_bucket_bytes(bucket_bytes: int) -> None:
    if bucket_bytes <= 0:
        raise ValueError(f"rollout.weight_bucket_mb must be > 0 (the weight-sync bucket size), got "
                         f"{bucket_bytes / MIB:g} MiB")


def bucketed(weights: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[WeightBucket]:
    """Pack (name, tensor) pairs, in order, into buckets of at most `bucket_bytes` (a larger tensor
    alone). Lazy: a bucket is handed out as soon as the next weight does not fit in it (that weight
    proves it is not the last), so at most one bucket and one weight are held here."""
    check_bucket_bytes(bucket_bytes)
    names: list[str] = []
    tensors: list[Tensor] = []
    size = 0
    index = 0
    for name, t in weights:
        n = t.numel() * t.element_size()
        if tensors and size + n > bucket_bytes:
            yield WeightBucket(tuple(names), tuple(tensors), index, False)
            index += 1
            names, tensors, size = [], [], 0
        names.append(name)
        tensors.append(t)
        size += n
    if tensors:
        yield WeightBucket(tuple(names), tuple(tensors), index, True)


__all__ = ["MIB", "WeightBucket", "WeightMeta", "bucketed", "check_bucket_bytes"]
