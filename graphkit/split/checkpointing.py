"""Non-reentrant activation checkpointing under the split backward: each region recomputed at most twice.

``torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)`` packs every tensor the region saves
into a holder (``_checkpoint_hook`` in ``torch/utils/checkpoint.py``). The first unpack in a backward
recomputes the region's forward and fills every holder for that backward; the holders are keyed by
the current :class:`torch.utils.checkpoint.GraphExecGroup`, or else by the engine call's graph task
id, and an unpack outside any engine call gets a fresh id - so each read outside the engine would
recompute the region again. Within one key each holder may be unpacked once.

graphkit's B phase is one engine call; its W phase two (the direct Node calls, then the weight-only
subgraph). Each phase runs under a ``GraphExecGroup`` of its own (:class:`CheckpointedRegions`), so a
region is recomputed at most once in B and at most once more in W, and the weight-side formulas never
read a hooked saved tensor (:func:`graphkit.split.weight_rules.prepare` refuses them). When W
recomputes is a choice (:class:`Recompute`):

- ``Recompute.IN_W`` (default): W recomputes the regions whose weights it serves. Between B and W a
  region costs only its checkpoint inputs, what users chose checkpointing for; B + W recompute each
  such region twice (a full backward: once).
- ``Recompute.KEEP_FROM_B``: the tensors B's recomputation produced for the Nodes W will call are kept
  for W, which then recomputes nothing: one recomputation over B + W, as in a full backward, at the
  cost of holding those saved tensors (about what these Nodes would save without checkpointing)
  between B and W.

A region checkpointed with ``preserve_rng_state=False`` recomputes with whatever random state is current,
so two recomputations of a region with dropout would draw two masks, and W's weight gradients would
not match B's input gradients. For such a region graphkit notes the random state (CPU, and the devices of
the region's inputs) when B's recomputation starts, and W's recomputation runs from that same state (in
``torch.random.fork_rng``, so the random state outside is left as B left it): B and W see one mask, the
one a full backward, recomputing once at B's time, would draw. A region W recomputes without B having
recomputed it draws once, in W. (Regions with ``preserve_rng_state=True``, the default, restore the
forward's random state themselves.)

A region checkpointed with ``debug=True`` can be recomputed only once (its logging context is single
use), so B's recomputation is kept for W there under either policy.

Both policies drop what PyTorch's frames keep after a phase (tensors recomputed for Nodes the phase
never ran), so nothing recomputed outlives the phase that needs it.

PyTorch has no public API for this; the private details used are isolated here and pinned by
``tests/test_checkpointing.py``: the ``frame`` cell of ``SavedTensor.unpack_hook``'s closure (a
``_CheckpointFrame``), ``SavedTensor.data`` (the ``_Holder``), the frame's ``recompute_fn``,
``recomputed``, ``is_recomputed``, ``recomp_counter`` and ``weak_holders``, ``_Holder.handles``,
``_Handle``, ``_StopRecomputationError``, the ``preserve_rng_state`` cell of ``recompute_fn``'s closure,
``_infer_device_type``, ``get_device_states`` / ``set_device_states``, and ``torch._C._get_graph_exec_group`` /
``_set_graph_exec_group`` (to swap, not nest, groups when a caller already set one).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd.graph import Node

__all__ = [
    "CheckpointedRegions",
    "Recompute",
    "checkpoint_frame",
    "checkpoint_tensors",
    "frame_tensors",
    "recompute_policy",
    "regions_of",
    "saves_tensors",
]


class Recompute(enum.StrEnum):
    """When the W phase gets the saved tensors of a non-reentrant checkpointed region (module docstring)."""

    IN_W = "in-w"
    KEEP_FROM_B = "keep-from-b"


def _checkpoint_module() -> Any:
    import torch.utils.checkpoint as checkpoint_module

    return checkpoint_module


def checkpoint_frame(saved: Any) -> Any | None:
    """The ``_CheckpointFrame`` behind a packed saved tensor, or None when other hooks packed it.

    ``saved`` is a ``torch._C._autograd.SavedTensor`` (a Node's ``_raw_saved_<name>`` entry). The
    frame is the ``frame`` cell of the unpack hook's closure; with ``debug=True`` that hook wraps the
    plain one, whose closure holds it.
    """
    frame_class = getattr(_checkpoint_module(), "_CheckpointFrame", None)
    hook = getattr(saved, "unpack_hook", None)
    stack = [hook] if hook is not None else []
    depth = 0
    while stack and depth < 3:  # the hook, and the hook it wraps: never deeper
        function = stack.pop()
        depth += 1
        for cell in getattr(function, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if frame_class is not None and isinstance(value, frame_class):
                return value
            if callable(value) and getattr(value, "__closure__", None):
                stack.append(value)
    return None


_raw_names_by_class: dict[type, tuple[str, ...]] = {}


def _raw_names(node: Node) -> tuple[str, ...]:
    cls = type(node)
    names = _raw_names_by_class.get(cls)
    if names is None:
        names = _raw_names_by_class[cls] = tuple(name for name in dir(node) if name.startswith("_raw_saved_"))
    return names


def saves_tensors(node: Node) -> bool:
    """Whether ``node``'s class has saved tensors at all (``_raw_saved_<name>`` attributes; cached)."""
    return bool(_raw_names(node))


def _raw_saved(node: Node) -> list[Any]:
    """Every ``SavedTensor`` ``node`` holds (its ``_raw_saved_<name>`` attributes, lists flattened)."""
    found = []
    for name in _raw_names(node):
        try:
            value = getattr(node, name)
        except RuntimeError:  # freed
            continue
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if item is not None:
                found.append(item)
    return found


def frame_tensors(frame: Any) -> list[torch.Tensor]:
    """Tensors a checkpoint frame keeps alive: its inputs and whatever it holds recomputed (any group)."""
    tensors = []
    for argument in getattr(frame, "saved_args", ()):
        if isinstance(argument, torch.Tensor):
            tensors.append(argument)
        elif hasattr(argument, "unpack"):
            try:
                tensors.append(argument.unpack())
            except RuntimeError:  # freed
                continue
    for by_handle in list(getattr(frame, "recomputed", {}).values()):
        tensors.extend(tensor for tensor in list(by_handle.values()) if isinstance(tensor, torch.Tensor))
    return tensors


def checkpoint_tensors(node: Node) -> list[torch.Tensor]:
    """What the checkpoint frames behind ``node``'s hooked saved tensors keep alive (:func:`frame_tensors`)."""
    frames = {}
    for saved in _raw_saved(node):
        frame = checkpoint_frame(saved)
        if frame is not None:
            frames[id(frame)] = frame
    return [tensor for frame in frames.values() for tensor in frame_tensors(frame)]


def _forget(frame: Any, group: Any) -> None:
    """Drop every trace of ``group`` from ``frame``: its recomputed tensors are freed."""
    frame.recomputed.pop(group, None)
    frame.is_recomputed.pop(group, None)
    frame.recomp_counter.pop(group, None)
    for reference in frame.weak_holders:
        holder = reference()
        if holder is not None:
            holder.handles.pop(group, None)


@contextmanager
def _in_group(group: Any) -> Iterator[None]:
    """Run under ``group``, replacing (not nesting in) a group the caller may have set."""
    previous = torch._C._get_graph_exec_group()
    torch._C._set_graph_exec_group(group)
    try:
        yield
    finally:
        torch._C._set_graph_exec_group(previous)


class CheckpointedRegions:
    """The checkpointed regions of one microbatch that the W phase reads, and one group per phase.

    Built by :func:`regions_of` in the B phase; :meth:`input_phase` wraps B's engine call,
    :meth:`weight_phase` the whole W phase.

    Attributes:
        policy: the :class:`Recompute` policy.
        frames: the ``_CheckpointFrame`` of each region, in the order found.
        recomputations: how often each phase recomputed a region (``{"b": n, "w": n}``).
    """

    def __init__(self, policy: Recompute, holders: dict[int, tuple[Any, list[Any]]]) -> None:
        checkpoint_module = _checkpoint_module()
        self.policy = Recompute(policy)
        self.frames = [frame for frame, _ in holders.values()]
        self._holders = holders  # id(frame) -> (frame, holders of the Nodes W unpacks)
        self._input_group = checkpoint_module.GraphExecGroup()
        self._weight_group = checkpoint_module.GraphExecGroup()
        self.recomputations = {"b": 0, "w": 0}
        # regions that do not restore the forward's random state: id(frame) -> B's random state, once noted
        self._fresh_draw = {id(frame) for frame in self.frames if not _preserves_rng_state(frame)}
        self._b_random_state: dict[int, _RandomState] = {}

    @contextmanager
    def input_phase(self) -> Iterator[None]:
        """B's engine call: one recomputation per region; under ``KEEP_FROM_B`` W's tensors are kept."""
        originals = [(frame, frame.recompute_fn) for frame in self.frames]
        for frame in self.frames:
            frame.recompute_fn = self._counted(frame, frame.recompute_fn, "b")
        try:
            with _in_group(self._input_group):
                yield
        finally:
            for frame, original in originals:
                frame.recompute_fn = original
            for frame in self.frames:
                _forget(frame, self._input_group)  # what B recomputed for Nodes it did not run

    @contextmanager
    def weight_phase(self) -> Iterator[None]:
        """All of W: at most one recomputation per region (none for those B kept)."""
        originals = [(frame, frame.recompute_fn) for frame in self.frames]
        for frame in self.frames:
            frame.recompute_fn = self._counted(frame, frame.recompute_fn, "w")
        try:
            with _in_group(self._weight_group):
                yield
        finally:
            for frame, original in originals:
                frame.recompute_fn = original
            self.release()

    def release(self) -> None:
        """Free everything recomputed for this microbatch's phases (idempotent)."""
        for frame in self.frames:
            _forget(frame, self._input_group)
            _forget(frame, self._weight_group)

    def tensors(self) -> list[torch.Tensor]:
        """What the regions keep alive now: checkpoint inputs and tensors kept from B."""
        return [tensor for frame in self.frames for tensor in frame_tensors(frame)]

    def _counted(self, frame: Any, recompute: Any, phase: str) -> Any:
        # checkpoint(debug=True) recomputes under a logging context that can be entered only once, so W
        # could not recompute such a region: B's recomputation is kept for W whatever the policy
        single_use = getattr(frame, "unpack_error_cb", None) is not None
        keep = phase == "b" and (self.policy is Recompute.KEEP_FROM_B or single_use)
        stop = _checkpoint_module()._StopRecomputationError

        fresh_draw = id(frame) in self._fresh_draw

        def recompute_region(*args: Any) -> None:
            self.recomputations[phase] += 1
            try:
                if fresh_draw and phase == "b":
                    self._b_random_state.setdefault(id(frame), _RandomState.now(args))
                    recompute(*args)
                elif fresh_draw and id(frame) in self._b_random_state:
                    with self._b_random_state[id(frame)].restored():
                        recompute(*args)
                else:
                    recompute(*args)
            except stop:  # the early stop once every holder is filled: the recomputation is complete
                if keep:
                    self._keep_for_weight_phase(frame)
                raise
            if keep:
                self._keep_for_weight_phase(frame)

        return recompute_region

    def _keep_for_weight_phase(self, frame: Any) -> None:
        """Hand what B just recomputed for the Nodes W calls to W's group, so W does not recompute.

        All or nothing: if one holder W needs was not filled, W recomputes the region itself.
        """
        group = torch._C._get_graph_exec_group()
        if group is not self._input_group:
            return
        recomputed = frame.recomputed[group]
        kept = []
        for holder in self._holders[id(frame)][1]:
            handle = holder.handles.get(group)
            if handle is None or handle not in recomputed:
                return
            kept.append((holder, recomputed[handle]))
        handle_class = _checkpoint_module()._Handle
        for holder, tensor in kept:
            handle = handle_class()
            holder.handles[self._weight_group] = handle
            frame.recomputed[self._weight_group][handle] = tensor
        frame.is_recomputed[self._weight_group] = True


def _preserves_rng_state(frame: Any) -> bool:
    """Whether a region's recomputation restores the forward's random state (``preserve_rng_state``).

    Read from the ``preserve_rng_state`` cell of the frame's ``recompute_fn`` closure; False when it
    cannot be read (restoring B's random state for W is then harmless: a region that restores its own
    sets it again inside).
    """
    function = getattr(frame, "recompute_fn", None)
    code = getattr(function, "__code__", None)
    if code is None or not function.__closure__:
        return False
    for name, cell in zip(code.co_freevars, function.__closure__, strict=False):
        if name == "preserve_rng_state":
            try:
                return bool(cell.cell_contents)
            except ValueError:
                return False
    return False


class _RandomState:
    """The CPU random state and that of the devices ``args`` live on, noted to run code from it again."""

    def __init__(self, cpu: torch.Tensor, device_type: str, devices: list[int], states: list[Any]) -> None:
        self.cpu, self.device_type, self.devices, self.states = cpu, device_type, devices, states

    @classmethod
    def now(cls, args: tuple[Any, ...]) -> _RandomState:
        checkpoint_module = _checkpoint_module()
        device_type = checkpoint_module._infer_device_type(*args)
        devices, states = checkpoint_module.get_device_states(*args)
        return cls(torch.get_rng_state(), device_type, devices, states)

    @contextmanager
    def restored(self) -> Iterator[None]:
        """Run from the noted state, leaving the random state outside as it was."""
        checkpoint_module = _checkpoint_module()
        with torch.random.fork_rng(devices=self.devices, device_type=self.device_type):
            torch.set_rng_state(self.cpu)
            if self.devices:
                checkpoint_module.set_device_states(self.devices, self.states, device_type=self.device_type)
            yield


def regions_of(nodes: Iterable[Node], policy: Recompute | str) -> CheckpointedRegions | None:
    """The checkpointed regions whose saved tensors ``nodes`` hold (the Nodes W will unpack), or None.

    Args:
        nodes: the intermediates W calls and the weight-only Nodes its engine call runs.
        policy: a :class:`Recompute` value (or its string).

    Raises:
        ValueError: ``policy`` is not a :class:`Recompute` value.
    """
    policy = recompute_policy(policy)
    holders: dict[int, tuple[Any, list[Any]]] = {}
    for node in nodes:
        for saved in _raw_saved(node):
            frame = checkpoint_frame(saved)
            if frame is None:
                continue
            entry = holders.setdefault(id(frame), (frame, []))
            holder = getattr(saved, "data", None)
            if holder is not None and hasattr(holder, "handles"):
                entry[1].append(holder)
    return CheckpointedRegions(policy, holders) if holders else None


def recompute_policy(policy: Recompute | str) -> Recompute:
    """``policy`` as a :class:`Recompute`.

    Raises:
        ValueError: it is none of the :class:`Recompute` values; the message lists them.
    """
    try:
        return Recompute(policy)
    except ValueError:
        choices = ", ".join(repr(value.value) for value in Recompute)
        raise ValueError(
            f"recompute must be one of {choices} (graphkit.split.Recompute), got {policy!r}"
        ) from None
