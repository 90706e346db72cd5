"""Device names as users give them (``--device``, ``device=``), checked before anything runs there."""

from __future__ import annotations

import torch

__all__ = ["checked_device"]


def checked_device(device: str | torch.device, error: type[ValueError] = ValueError) -> torch.device:
    """``device`` parsed (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"meta"``...), refusing a CUDA device this
    torch cannot use (a CPU-only build, no GPU).

    Args:
        device: a device name or a ``torch.device``.
        error: the exception class raised, so that each caller keeps its own (``SpecError`` for specs,
            ``GraphkitInputError`` for the library's arguments).

    Raises:
        error: ``device`` is not a device name, or names CUDA where no CUDA device is available.
    """
    try:
        parsed = torch.device(device)
    except RuntimeError as problem:
        raise error(
            f"device {device!r} is not a device name (cpu, cuda, cuda:1, meta, ...): {problem}"
        ) from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise error(
            f"device {str(device)!r}: no CUDA device is available to this torch ({torch.__version__}); "
            "leave the device out to run on the CPU"
        )
    return parsed
