"""Argument checks shared by swerl.algo: every failure is a ValueError that names the argument.

Checks that read tensor values (finiteness, ranges) need a host-device synchronisation. check_finite
syncs once per call; DeferredChecks queues any number of such checks as device-side flags and reads
them all with one sync, building the precise error message only on the failure path. They run on
per-episode or per-token inputs (rewards, advantages, masks), never on (N, V) buffers.
"""

import math
from collections.abc import Callable

import torch
from torch import Tensor


def check_tensor(x: object, name: str, *, ndim: int | None = None, kind: str | None = None) -> Tensor:
    """Returns x after checking it is a tensor with `ndim` dims and dtype `kind` ("float", "int", "bool")."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")
    if kind == "float" and not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if kind == "int" and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise ValueError(f"{name} must be an integer tensor, got dtype {x.dtype}")
    return x


def check_same_shape(x: Tensor, name: str, ref: Tensor, ref_name: str) -> None:
    if x.shape != ref.shape:
        raise ValueError(
            f"{name} must have the same shape as {ref_name} {tuple(ref.shape)}, got {tuple(x.shape)}"
        )


def _not_finite(x: Tensor, where: Tensor | None) -> Tensor:
    bad = ~torch.isfinite(x)
    return bad if where is None else bad & where


def _finite_message(x: Tensor, name: str, where: Tensor | None) -> str:
    return f"{name} must be finite, got {int(_not_finite(x, where).sum())} NaN/inf value(s)"


def check_finite(x: Tensor, name: str, where: Tensor | None = None) -> None:
    """Rejects NaN/inf in x (only at positions where `where` is True, when given)."""
    if bool(_not_finite(x, where).any()):
        raise ValueError(_finite_message(x, name, where))


class DeferredChecks:
    """Data-dependent checks evaluated together, with one host sync.

    Each check is a 0-dim tensor, nonzero when the check fails, and a message builder. `check` reads
    every flag (plus any integer scalars the caller needs on the host) in one transfer and raises the
    ValueError of the first failing check, in the order the checks were added; messages are built
    only then, so they may read tensors freely.
    """

    def __init__(self) -> None:
        self._failed: list[Tensor] = []
        self._messages: list[Callable[[], str]] = []

    def add(self, failed: Tensor, message: Callable[[], str]) -> None:
        self._failed.append(failed.reshape(1))
        self._messages.append(message)

    def finite(self, x: Tensor, name: str, where: Tensor | None = None) -> None:
        """Queues check_finite(x, name, where)."""
        x = x.detach()
        probe = x * 0  # ±0 where x is finite, NaN at NaN/inf; its sum is 0 iff all are finite
        if where is not None:
            probe = torch.where(where, probe, 0)
        self.add(probe.sum() != 0, lambda: _finite_message(x, name, where))

    def any_failed(self) -> Tensor:
        """0-dim bool tensor, True if some check fails; no sync."""
        if not self._failed:
            raise ValueError("no checks were added")
        return torch.cat(self._failed).any()

    def check(self, *values: Tensor) -> list[int]:
        """Raises for the first failing check, else returns `values` (0-dim integer tensors) as ints."""
        if not self._failed and not values:
            return []
        host = torch.cat([*self._failed, *(v.reshape(1) for v in values)]).tolist()
        k = len(self._failed)
        for failed, message in zip(host[:k], self._messages, strict=True):
            if failed:
                raise ValueError(message())
        return [int(v) for v in host[k:]]


def check_number(
    value: object,
    name: str,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_inclusive: bool = True,
) -> float:
    """Returns value as a float after checking it is a finite real number in range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if min_value is not None and (v < min_value or (v == min_value and not min_inclusive)):
        op = ">=" if min_inclusive else ">"
        raise ValueError(f"{name} must be {op} {min_value}, got {value!r}")
    if max_value is not None and v > max_value:
        raise ValueError(f"{name} must be <= {max_value}, got {value!r}")
    return v


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value  # type: ignore[return-value]


def bool_mask(mask: object, name: str, shape: torch.Size) -> Tensor:
    """A 0/1 (bool or numeric) mask as bool; any nonzero value counts as selected."""
    m = check_tensor(mask, name)
    if m.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(m.shape)}")
    return m if m.dtype == torch.bool else m != 0
