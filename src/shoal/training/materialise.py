"""Models built without memory, then given values only where a rank holds them.

A model larger than one device cannot be built whole on every rank and then cut. A task
that can (:class:`MetaBuild`) builds its model with every parameter on the meta device
(shapes, no storage) and its buffers real (small, often computed by the constructor: a
rotary table); a strategy lays the meta model out (a tensor plan, FSDP), and
:func:`materialise` then gives each parameter its values, one *unit* at a time (each of the
model's repeated blocks, then the rest): the unit's parameters are made on the CPU, whole,
initialised by the task (`init_module`, applied to each of the unit's modules, children
first, as `nn.Module.apply` does), and each rank copies its own piece of each into its
parameter. At most one unit is ever whole in memory.

A unit's values come from a generator seeded by a number the caller's seeded generator
draws once (:func:`draw_base`) and the unit's path, so they do not depend on the layout:
one process materialising the whole model in place gets the initial parameters every
sharded layout holds pieces of (local == sharded), and a block's values do not depend on
how many blocks came before.

Every parameter is filled with NaN before its unit's initialisation, so one that no
initialiser sets (a raw `nn.Parameter` in a module with no `reset_parameters`) is named in
one line instead of training from garbage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from shoal.errors import ShoalError
from shoal.runtime.dtensors import is_dtensor


@runtime_checkable
class MetaBuild(Protocol):
    """A task whose model can be built on the meta device and initialised unit by unit."""

    def build_meta_model(self) -> nn.Module | None:
        """The model, its parameters on the meta device and its buffers real (None: this
        task's model exists only whole, e.g. a module the user built)."""
        ...

    def init_units(self, model: nn.Module) -> list[str]:
        """The paths of the submodules initialised one at a time (the repeated blocks);
        the rest of the model is one more unit."""
        ...

    def init_module(self, model: nn.Module, module: nn.Module) -> None:
        """Set `module`'s own parameters (`model`: the whole model, whose submodule it is)."""
        ...

    def weights_for(self, model: nn.Module) -> WeightSource | None:
        """Pretrained values for `model`'s tensors (None: none, initialise them all)."""
        ...


class WeightSource(Protocol):
    """Pretrained values by the model's tensor names (`tasks/module/weights.py`)."""

    def has(self, name: str) -> bool: ...

    def full(self, name: str) -> torch.Tensor:
        """The whole tensor, on the CPU."""
        ...

    def read_into(self, name: str, target: torch.Tensor) -> None:
        """`target`'s piece of it (a DTensor: its local shard)."""
        ...


def meta_builder(task: Any) -> MetaBuild | None:
    return task if isinstance(task, MetaBuild) else None


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside goes to the meta device at once; buffers stay
    where the constructor made them. (A constructor's `reset_parameters` then runs on the
    meta tensors: no memory, no time.)"""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = _to_meta(param)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def _to_meta(param: nn.Parameter) -> nn.Parameter:
    meta = param.detach().to("meta")
    try:  # a Parameter subclass keeps its class and attributes
        moved = type(param)(meta, requires_grad=param.requires_grad)
        moved.__dict__.update(param.__dict__)
        return moved
    except TypeError:
        return nn.Parameter(meta, requires_grad=param.requires_grad)


def on_meta(model: nn.Module) -> bool:
    return any(_local(p).is_meta for p in model.parameters())


def draw_base() -> int:
    """The number unit seeds derive from, drawn from torch's (caller-seeded) generator."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def unit_seed(base: int, path: str) -> int:
    digest = hashlib.sha256(f"{base}/{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def materialise(
    model: nn.Module,
    builder: MetaBuild,
    base: int,
    device: torch.device,
    shadow: nn.Module | None = None,
    weights: WeightSource | None = None,
) -> None:
    """Give every parameter of `model` (on the meta device) its values.

    `shadow`: the unsharded meta model `model` was laid out from (`copy.deepcopy` before
    the layout), in which units are initialised whole before each rank copies its pieces
    into `model`'s parameters (DTensors: their local shards); None: `model` is not laid
    out, and is initialised in place. The buffers are kept (from `shadow`, or `model`'s
    own) and moved to `device`. `weights`: pretrained values of the tensors it has, read
    instead of initialised (each rank reading its pieces)."""
    source = shadow if shadow is not None else model
    buffers = {name: buf for name, buf in source.named_buffers(remove_duplicate=False)}
    if shadow is not None:
        model.to_empty(device=device)
        for name, buf in model.named_buffers(remove_duplicate=False):
            if name in buffers:
                buf.copy_(buffers[name])
        targets = dict(model.named_parameters(remove_duplicate=False))
    paths = builder.init_units(source)
    unit_of = _unit_of(source, paths)
    owner = {id(p): name for name, p in source.named_parameters()}  # a tied one's first name
    home = {i: _block_of(name, paths) for i, name in owner.items()}  # its unit
    # in place: id(meta parameter) -> (it, kept alive so its id is not reused; its values)
    made: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}
    loaded: set[int] = set()  # the meta parameters `weights` gave values
    for ident, name in owner.items() if weights is not None else ():
        assert weights is not None
        if not weights.has(name):
            continue
        loaded.add(ident)
        if shadow is not None:
            if name in targets:  # (a pipeline stage holds only some)
                weights.read_into(name, targets[name])
        else:
            meta = source.get_parameter(name)
            value = weights.full(name).to(dtype=meta.dtype, device=device)
            made[ident] = (meta, nn.Parameter(value, requires_grad=meta.requires_grad))
    # laid out: only the units of which `model` holds a parameter (a pipeline stage's)
    needed = (
        {
            home[id(p)]
            for name, p in source.named_parameters(remove_duplicate=False)
            if name in targets
        }
        if shadow is not None
        else None
    )
    for path in [*paths, ""]:
        if needed is not None and path not in needed:
            continue
        modules = [
            m for m in _post_order(source.get_submodule(path) if path else source)
            if unit_of[id(m)] == path
        ]  # fmt: skip
        fresh, put_back = _fill(modules, home, path, made.keys() | loaded)
        if not fresh:
            continue
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(unit_seed(base, path))
            for module in modules:
                builder.init_module(source, module)
        unset = [owner[i] for i, p in fresh.items() if p.is_floating_point() and p.isnan().any()]
        if unset:
            raise ShoalError(
                f"no initialiser sets parameter {unset[0]}"
                + (f" (and {len(unset) - 1} more)" if len(unset) > 1 else "")
                + ": give its module a reset_parameters(), or the factory an init(module)"
            )
        for module, name, original in put_back:
            values = module._parameters[name]
            assert values is not None
            if shadow is None:
                if id(original) not in made:  # (a parameter tied within the unit: once)
                    made[id(original)] = (original, _placed(values, device))
                module._parameters[name] = made[id(original)][1]
            else:
                target = targets.get(owner[id(original)])
                if target is not None:  # (a pipeline stage holds only some)
                    copy_piece(target, values)
                module._parameters[name] = original
    if shadow is None:
        _retie(model, made)
    for name, buf in list(model.named_buffers(remove_duplicate=False)):
        if weights is not None and weights.has(name):
            weights.read_into(name, buf)
        if shadow is None:
            _set_buffer(model, name, buf.to(device))


def hold_only(model: nn.Module, keep: Collection[int]) -> None:
    """Every parameter of `model` whose id is not in `keep` back on the meta device (its
    storage freed; its name, shape and ties kept): a rank drops what it does not hold."""
    moved: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None or id(param) in keep or param.is_meta:
                continue
            if id(param) not in moved:
                moved[id(param)] = _to_meta(param)
            module._parameters[name] = moved[id(param)]


def buffers_to(model: nn.Module, device: torch.device) -> None:
    """Every buffer of `model` on `device` (its parameters untouched, some on meta)."""
    for name, buf in list(model.named_buffers(remove_duplicate=False)):
        if buf.device != device:
            _set_buffer(model, name, buf.to(device))


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _block_of(name: str, paths: list[str]) -> str:
    """The block path a parameter name lies under ("": none)."""
    for path in paths:
        if name.startswith(path + "."):
            return path
    return ""


def _unit_of(model: nn.Module, paths: list[str]) -> dict[int, str]:
    """The unit of every module: the block path it lies in, "" for the rest."""
    unit = {id(m): "" for m in model.modules()}
    for path in paths:
        for m in model.get_submodule(path).modules():
            unit[id(m)] = path
    return unit


def _fill(
    modules: list[nn.Module],
    home: dict[int, str],
    path: str,
    skip: Collection[int],
) -> tuple[dict[int, nn.Parameter], list[tuple[nn.Module, str, nn.Parameter]]]:
    """Put a NaN-filled CPU parameter in place of each meta parameter the unit owns (a
    tied one: in the unit of its first name; elsewhere it stays on meta, so another unit's
    initialisation cannot write it). Returns {id(meta parameter): its new one} and the
    (module, name, meta parameter) to put back."""
    fresh: dict[int, nn.Parameter] = {}
    put_back = []
    for module in modules:
        for name, param in module._parameters.items():
            if param is None or not _local(param).is_meta or id(param) in skip:
                continue
            if home[id(param)] != path:
                continue
            if id(param) not in fresh:
                values = torch.full(param.shape, float("nan"), dtype=param.dtype)
                if not values.is_floating_point():
                    values = torch.zeros(param.shape, dtype=param.dtype)
                fresh[id(param)] = nn.Parameter(values, requires_grad=param.requires_grad)
            module._parameters[name] = fresh[id(param)]
            put_back.append((module, name, param))
    return fresh, put_back


def _placed(param: nn.Parameter, device: torch.device) -> nn.Parameter:
    if param.device == device:
        return param
    return nn.Parameter(param.detach().to(device), requires_grad=param.requires_grad)


def _retie(model: nn.Module, made: dict[int, tuple[nn.Parameter, nn.Parameter]]) -> None:
    """A parameter shared by modules of different units is one object again everywhere."""
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and id(param) in made:
                module._parameters[name] = made[id(param)][1]


def _set_buffer(model: nn.Module, name: str, value: torch.Tensor) -> None:
    path, _, leaf = name.rpartition(".")
    module = model.get_submodule(path) if path else model
    persistent = leaf not in module._non_persistent_buffers_set
    module.register_buffer(leaf, value, persistent=persistent)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if is_dtensor(tensor) else tensor


def copy_piece(target: torch.Tensor, full: torch.Tensor) -> None:
    """This rank's piece of `full` into `target` (a DTensor: its local shard, by the
    placements' offsets; no collective)."""
    with torch.no_grad():
        if is_dtensor(target):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            shape, offset = compute_local_shape_and_global_offset(
                full.shape, target.device_mesh, target.placements
            )
            piece = full[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))]
            target.to_local().copy_(piece)
        else:
            target.copy_(full)
