"""One registry mechanism for every family of implementations found by name: the families
users may extend (built-ins and plugins alike) and the closed choices inside one plugin.

A *plugin* is an implementation (a strategy class, a task class, an aggregation
method...) and the pydantic model of its config section. It comes from one of
three places, and the registry records which:

- **built-in**: shoal's own, listed in `plugins/kinds.py` as "module:attribute"
  strings, so that assembling the config schema imports config modules only
  (never torch or a strategy's run-time modules);
- **entry point**: any installed distribution that declares one in the kind's
  group (`shoal.strategies`, `shoal.tasks`, ...), `name = "module:ConfigClass"`:
  it names the plugin's *config* model, which names its implementation in
  `implementation = "module:Class"`. Every installed plugin's config joins the
  schema, so the entry point must be light to import: a config module imports
  pydantic and `shoal.config.base`, never torch or the plugin's run-time code
  (which, importing shoal's loops, would import the config being assembled);
- **dotted path**: `[strategy] type = "custom"` with `class = "module:Class"`, for
  one-off experiments (see `config/custom.py`): the implementation, whose
  `config_class` is its config model. It is imported only when a config names it.

Every failure a user can cause (a plugin that does not import, a class of the
wrong type, a name taken twice, an unknown name) is a one-line `PluginError`
naming the plugin's origin and how to fix it. Modelled on PyTorch-BigGraph's
`plugin.py` (names -> classes, an error listing the valid names) and
torchtitan's `register_train_spec` (users add a family member without editing
the package).
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from shoal.errors import ConfigError


class PluginError(ConfigError):
    """A plugin cannot be used: it does not import, has the wrong type, or its name is taken."""


@dataclass(frozen=True)
class Kind:
    """One family of plugins: its entry-point group and the config field that names a member."""

    key: str  #: "strategies", the suffix of the entry-point group
    noun: str  #: "strategy", as messages say it
    tag: str  #: the discriminator of its config union: type, method or kind
    base: str | None  #: "module:Class" every implementation must subclass (None: any class)
    builtins: tuple[tuple[str, str, str], ...]  #: (name, implementation, config class)
    #: "module:Class" every config model must subclass (None: any pydantic model): the
    #: options every member shares, which the code around it reads (a KG model's `reciprocal`)
    config_base: str | None = None
    #: a closed choice inside one plugin (a federated aggregation, a KGE training type): its
    #: built-ins only, no entry points; users extend it by writing their own strategy or task
    closed: bool = False

    @property
    def group(self) -> str:
        return f"shoal.{self.key}"


def import_target(target: str) -> Any:
    """`"package.module:attr.sub"` -> the object (ImportError / AttributeError as raised)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{target!r} is not of the form 'package.module:Class'")
    try:
        value: Any = importlib.import_module(module_name)
    except SystemExit as exc:  # a module that ends the process when imported is broken
        raise ImportError(f"{module_name} called sys.exit({exc.code!r}) while imported") from None
    for part in attr.split("."):
        value = getattr(value, part)
    return value


def _cause(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError):
        return f"cannot import it: no module named {exc.name!r}"
    if isinstance(exc, AttributeError):
        return f"cannot import it: {exc}"
    return f"cannot import it: {type(exc).__name__}: {exc}"


@dataclass
class Plugin:
    """One registered member of a kind, loaded on first use."""

    kind: Kind
    name: str
    origin: str  #: "built-in", "shoal-local-sgd 0.1.0, entry point ...", "dotted path ..."
    target: str | None  #: "module:Class" of the implementation (None: the config names it)
    config_target: str | None = None  #: "module:Class" of the config model (None: the class's)
    _implementation: Any = field(default=None, repr=False)
    _config: type[BaseModel] | None = field(default=None, repr=False)

    def _fail(self, cause: str) -> PluginError:
        return PluginError(f"{self.kind.noun} plugin {self.name!r} ({self.origin}): {cause}")

    def load(self) -> Any:
        """The implementation, imported once and checked against the kind's base class."""
        if self._implementation is None:
            target = self.target or self._implementation_target()
            try:
                value = import_target(target)
            except Exception as exc:
                raise self._fail(_cause(exc)) from None
            if self.kind.base is not None:
                base = import_target(self.kind.base)
                if not (isinstance(value, type) and issubclass(value, base)):
                    raise self._fail(
                        f"{target} is not a subclass of {base.__module__}.{base.__qualname__}"
                    )
            self._implementation = value
        return self._implementation

    def _implementation_target(self) -> str:
        target = getattr(self.config_class(), "implementation", None)
        if not isinstance(target, str):
            raise self._fail(
                f"its config class {self.config_class().__name__} needs a class attribute "
                "implementation: ClassVar[str] = 'module:Class' naming the plugin's class"
            )
        return target

    def config_class(self) -> type[BaseModel]:
        """The pydantic model of this plugin's config section (its `config_class`)."""
        if self._config is None:
            if self.config_target is not None:
                try:
                    model = import_target(self.config_target)
                except Exception as exc:
                    raise self._fail(_cause(exc)) from None
                if not (isinstance(model, type) and issubclass(model, BaseModel)):
                    raise self._fail(
                        f"{self.config_target} is not a pydantic model; the entry point names "
                        "the plugin's config class (a shoal.config.base.ConfigModel)"
                    )
            else:
                model = getattr(self.load(), "config_class", None)
                if not (isinstance(model, type) and issubclass(model, BaseModel)):
                    raise self._fail(
                        f"{self.target} needs a `config_class` attribute naming a pydantic "
                        f"model (a shoal.config.base.ConfigModel), got {model!r}"
                    )
            if self.kind.config_base is not None:
                base = import_target(self.kind.config_base)
                if not issubclass(model, base):
                    raise self._fail(
                        f"its config class {model.__name__} must subclass "
                        f"{base.__module__}.{base.__qualname__} (the options every "
                        f"{self.kind.noun} takes)"
                    )
            self._config = model
        return self._config

    def check_tag(self) -> None:
        """The config model's discriminator must be `Literal[name]`, so the union can pick it."""
        model = self.config_class()
        annotation = model.model_fields.get(self.kind.tag)
        args = typing.get_args(annotation.annotation) if annotation is not None else ()
        if annotation is None or typing.get_origin(annotation.annotation) is not Literal:
            got = "no such field" if annotation is None else f"{annotation.annotation!r}"
            raise self._fail(
                f"its config class {model.__name__} needs the field "
                f'{self.kind.tag}: Literal["{self.name}"] = "{self.name}" ({got})'
            )
        if args != (self.name,):
            raise self._fail(
                f"its config class {model.__name__} has {self.kind.tag} = {args[0]!r}; the "
                f"entry point's name must equal it (rename one of them)"
            )

    def doc(self) -> str:
        """The first sentence-paragraph of the config class's docstring: what this plugin does."""
        text = (self.config_class().__doc__ or "").strip()
        return " ".join(text.split("\n\n")[0].split())


def _distribution(entry: metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    if dist is None:
        return "an installed distribution"
    return f"{dist.metadata['Name']} {dist.version}"


class PluginRegistry:
    """The members of one kind: built-ins first, then installed entry points, by name."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self._plugins: dict[str, Plugin] | None = None

    def _discover(self) -> dict[str, Plugin]:
        found: dict[str, Plugin] = {}
        for name, target, config in self.kind.builtins:
            found[name] = Plugin(self.kind, name, "built-in", target, config)
        if self.kind.closed:
            return found
        for entry in sorted(metadata.entry_points(group=self.kind.group), key=lambda e: e.name):
            plugin = Plugin(
                self.kind,
                entry.name,
                f"{_distribution(entry)}, entry point {self.kind.group}: "
                f"{entry.name} = {entry.value}",
                None,
                entry.value,
            )
            if entry.name in found:
                raise PluginError(
                    f"{self.kind.noun} name {entry.name!r} is registered twice: by "
                    f"{found[entry.name].origin} and by {plugin.origin}; rename the plugin's "
                    "entry point (and its config's "
                    f"{self.kind.tag}) or uninstall one of them"
                )
            found[entry.name] = plugin
        return found

    @property
    def plugins(self) -> dict[str, Plugin]:
        if self._plugins is None:
            self._plugins = self._discover()
        return self._plugins

    def reset(self) -> None:
        """Forget what was discovered (tests that install a plugin on the fly)."""
        self._plugins = None

    def names(self) -> list[str]:
        return list(self.plugins)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.plugins

    def get(self, name: str) -> Plugin:
        try:
            return self.plugins[name]
        except KeyError:
            known = ", ".join(self.plugins) or "(none)"
            if self.kind.closed:
                raise PluginError(f"unknown {self.kind.noun} {name!r}; known: {known}") from None
            raise PluginError(
                f"unknown {self.kind.noun} {name!r}; registered: {known} (`shoal plugins` "
                "lists them with where each comes from)"
            ) from None

    def load(self, name: str) -> Any:
        """The implementation registered under `name`."""
        return self.get(name).load()

    def config_union(self, *extra: type[BaseModel]) -> Any:
        """The config models of every member (and `extra` ones, such as `type = "custom"`), as
        a union discriminated by the kind's tag."""
        models: list[type[BaseModel]] = []
        for plugin in self.plugins.values():
            if plugin.origin != "built-in":
                plugin.check_tag()  # imports the config model only, not the implementation
            models.append(plugin.config_class())
        models.extend(extra)
        if len(models) == 1:
            return models[0]
        return Annotated[typing.Union[tuple(models)], Field(discriminator=self.kind.tag)]  # noqa: UP007


def closed_choice(
    noun: str, tag: str, module: str, config_module: str, members: dict[str, tuple[str, str]]
) -> PluginRegistry:
    """A closed choice inside one plugin (a federated aggregation method, a KGE training
    type): `members` maps each name to (its implementation in `module`, its config class in
    `config_module`); no entry points."""
    builtins = tuple(
        (name, f"{module}:{implementation}", f"{config_module}:{config}")
        for name, (implementation, config) in members.items()
    )
    return PluginRegistry(
        Kind(noun.replace(" ", "_") + "s", noun, tag, None, builtins, closed=True)
    )
