"""One gradient against its reference: the comparison ``verify_split`` and ``verify_pipeline`` share.

:func:`compare_gradients` compares a gradient with the reference (a full backward's) and returns a
:class:`GradientCheck`: its status, the largest absolute difference, the relative error and whether the
two are equal bit for bit. The relative error is ``max |gradient - reference| / max |reference|``: the
largest difference over the largest reference magnitude (the infinity norm, as ``torch.testing`` scales
its tolerances by the values compared), so one wrong element shows at full size however many right ones
surround it. Both sides are widened to float64 (complex128 for complex gradients) before subtracting.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["STATUSES", "GradientCheck", "compare_gradients", "relative_error"]

STATUSES = ("ok", "wrong", "missing", "unexpected")
"""``ok``: within the tolerance; ``wrong``: beyond it, or shapes differ; ``missing``: the reference has a
gradient the checked run does not; ``unexpected``: the other way round."""


@dataclass(slots=True)
class GradientCheck:
    """One compared gradient.

    Attributes:
        name: the parameter's or input's name.
        status: one of :data:`STATUSES` (``ok`` when neither side has a gradient).
        max_abs_error: the largest ``|gradient - reference|`` over the elements; None when either side has
            no gradient or the shapes differ.
        relative_error: ``max_abs_error`` over the largest ``|reference|`` (0 for two zero gradients,
            ``inf`` for a difference from a zero reference); None where ``max_abs_error`` is.
        bitwise: whether the gradient equals the reference bit for bit (both None counts as equal).

    A check over several steps (:class:`graphkit.pipelining.verification.ParameterVerification`) keeps the
    largest errors and the first status that is not ``ok``.
    """

    name: str
    status: str = "ok"
    max_abs_error: float | None = None
    relative_error: float | None = None
    bitwise: bool = True

    @property
    def ok(self) -> bool:
        """Whether the gradient matches its reference within the tolerance (status ``ok``)."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "max_abs_error": self.max_abs_error,
            "relative_error": self.relative_error,
            "bitwise": self.bitwise,
        }

    @property
    def max_abs_err(self) -> float | None:
        """Deprecated: :attr:`max_abs_error`."""
        _warn_renamed("max_abs_err", "max_abs_error")
        return self.max_abs_error

    @property
    def max_rel_err(self) -> float | None:
        """Deprecated: :attr:`relative_error` (the same largest difference over the largest magnitude)."""
        _warn_renamed("max_rel_err", "relative_error")
        return self.relative_error


def _warn_renamed(old: str, new: str) -> None:
    warnings.warn(
        f"GradientCheck.{old} is deprecated and will be removed in the next release: use .{new} (same value)",
        DeprecationWarning,
        stacklevel=3,
    )


def relative_error(max_abs_error: float, reference_magnitude: float) -> float:
    """``max_abs_error / reference_magnitude``: 0 for two zero gradients, ``inf`` for a difference from
    a zero reference."""
    if reference_magnitude > 0:
        return max_abs_error / reference_magnitude
    return 0.0 if max_abs_error == 0 else float("inf")


def compare_gradients(
    name: str, reference: torch.Tensor | None, gradient: torch.Tensor | None, tolerance: float
) -> GradientCheck:
    """Compare ``gradient`` with ``reference`` (tensors of the same shape, any floating or complex dtype).

    Args:
        name: what the check is called in reports.
        reference: the full backward's gradient (None: it gave none).
        gradient: the checked run's gradient (None: it gave none).
        tolerance: the largest relative error (see the module docstring) that still passes; 0 asks for
            equality within rounding to float64.

    NaN and inf compare by place: where ``reference`` holds them, ``gradient`` must hold the same ones at
    the same places (else ``wrong``, with infinite errors), and the finite rest is compared by value.

    Returns:
        A :class:`GradientCheck`: ``ok`` or ``wrong`` by the relative error, ``missing`` / ``unexpected``
        when one side has no gradient, ``wrong`` when the shapes differ.
    """
    if reference is None and gradient is None:
        return GradientCheck(name, "ok", None, None, True)
    if reference is None:
        return GradientCheck(name, "unexpected", None, None, False)
    if gradient is None:
        return GradientCheck(name, "missing", None, None, False)
    if reference.shape != gradient.shape:
        return GradientCheck(name, "wrong", None, None, False)
    reference, gradient = reference.detach(), gradient.detach()
    wide = torch.complex128 if reference.is_complex() or gradient.is_complex() else torch.float64
    reference_wide, gradient_wide = reference.to(wide), gradient.to(wide)
    finite = torch.isfinite(reference_wide)
    same_places = True
    if not bool(finite.all()) or not bool(torch.isfinite(gradient_wide).all()):
        # a full backward that gives NaN or inf (a row of attention masked out entirely, an overflow): the
        # checked gradient must hold the same ones at the same places; the finite rest is compared by value
        same = (reference_wide == gradient_wide) | (reference_wide.isnan() & gradient_wide.isnan())
        if not (torch.equal(finite, torch.isfinite(gradient_wide)) and bool(same[~finite].all())):
            return GradientCheck(name, "wrong", math.inf, math.inf, False)
        reference_wide, gradient_wide = reference_wide[finite], gradient_wide[finite]
        same_places = bool(same.all())
    if reference_wide.numel():
        difference = (gradient_wide - reference_wide).abs().max().item()
        scale = reference_wide.abs().max().item()
    else:
        difference = scale = 0.0
    relative = relative_error(difference, scale)
    # the widening to float64 / complex128 is exact, so a zero difference is equality bit for bit
    bitwise = reference.dtype == gradient.dtype and same_places and difference == 0.0
    return GradientCheck(name, "ok" if relative <= tolerance else "wrong", difference, relative, bitwise)
