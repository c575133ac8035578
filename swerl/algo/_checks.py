"""Argument checks shared by swerl.algo: every failure is a ValueError that names the argument.

Checks that read tensor values (finiteness, ranges) synchronise with the device once each; they run
on per-episode or per-token inputs (rewards, advantages, masks), never on (N, V) buffers.
"""

import math

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


def check_finite(x: Tensor, name: str, where: Tensor | None = None) -> None:
    """Rejects NaN/inf in x (only at positions where `where` is True, when given)."""
    bad = ~torch.isfinite(x)
    if where is not None:
        bad &= where
    if bool(bad.any()):
        raise ValueError(f"{name} must be finite, got {int(bad.sum())} NaN/inf value(s)")


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
