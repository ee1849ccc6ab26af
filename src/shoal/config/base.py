"""The base every config model derives from.

Configs are data: strict types (a string is not silently turned into a number),
unknown keys rejected, and every field documented where it is declared, so that
`shoal config schema` and the CLI read their help text from one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Self, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo
from pydantic.fields import FieldInfo

from shoal.errors import ConfigError
from shoal.protocols.capabilities import Capability
from shoal.shape.hosts import Hosts
from shoal.shape.job import JobShape, Shrink
from shoal.shape.roles import RankRoles


class ConfigModel(BaseModel):
    """Strict, closed config section. No number in a config is inf or nan (TOML writes both):
    `lr = inf` would pass `gt = 0` and train nothing but NaNs from the first step."""

    model_config = ConfigDict(
        extra="forbid", strict=True, validate_default=True, allow_inf_nan=False
    )

    def check(self, config: Any) -> None:
        """Rules between this section and the rest of the job (`config`, the whole validated
        ShoalConfig): raise `FieldError` with the path, from the top, of the field to blame.

        Run once every section is valid, for the `[strategy]` and `[task]` sections; a
        section passes it on to its parts that have rules of their own (data_parallel to
        its aggregation, which passes it to its compression). One place per plugin, so
        the top-level config never looks inside a section it does not own."""


#: `json_schema_extra` of a field a resume may change freely: it changes neither the problem
#: nor the shape of the saved state (how long, how often, on how many workers). On a table
#: chosen among variants (a union), it classes a change of the variant (its `type`).
RESUME_SAFE: dict[str, Any] = {"resume": "safe"}
#: ... of a field whose change the saved state cannot load into (a model's shape, what the
#: ids mean): a resume that changes it is refused. Unmarked fields change the problem: a
#: resume needs `--allow-changes` for them (checkpoint/changes.py).
RESUME_FIXED: dict[str, Any] = {"resume": "incompatible"}


def resolve_existing_file(value: str, info: ValidationInfo, kind: str = "file") -> str:
    """Resolve a path against the config file's folder and require that it exists (a
    file; with `kind = "folder"`, a file or a folder).

    Relative paths in a config mean "next to this config", whatever the current
    directory is when `shoal train` runs; the resolved config saved in the run
    directory then holds absolute paths and can be rerun from anywhere.
    """
    base = (info.context or {}).get("base_dir")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    try:
        path = path.resolve()
    except (RuntimeError, OSError):  # RuntimeError: "Symlink loop from ..." (Python < 3.13)
        raise ValueError(
            f"{path}: a symbolic link that leads back to itself (a loop); point it at the {kind}"
        ) from None
    if not (path.is_file() or (kind == "folder" and path.is_dir())):
        raise ValueError(f"{kind} not found: {path}")
    return str(path)


ExistingFile = Annotated[str, AfterValidator(resolve_existing_file)]
"""A path to an existing file, relative paths taken from the config's folder."""


def _checks_file(metadata: Any) -> bool:
    return any(getattr(item, "func", None) is resolve_existing_file for item in metadata)


def is_file_field(info: FieldInfo) -> bool:
    """Whether a config field is an `ExistingFile` (also inside `ExistingFile | None`).

    A checkpoint records the size and checksum of every such file, so a resume can tell
    when the data behind an unchanged path has changed."""
    if _checks_file(info.metadata):
        return True
    return any(
        get_origin(arg) is Annotated and _checks_file(arg.__metadata__)
        for arg in get_args(info.annotation)
    )


def fill_default_tag(data: Any, field: str, tag: str, default: str) -> Any:
    """Let a table that omits its discriminator mean the default variant.

    `optimizer = { lr = 0.1 }` is an SGD optimizer, `[task.data]` with only
    `samples = ...` is the synthetic source: the variant the field defaults to.
    """
    if isinstance(data, dict) and isinstance(data.get(field), dict) and tag not in data[field]:
        return {**data, field: {tag: default, **data[field]}}
    return data


class FieldError(ValueError):
    """A rule broken at a field *below* the validator that found it.

    A model's validator (or a plugin's `check`) that sees a problem in one of its
    fields, or in the section of another, raises this with the path of that field
    from the model being validated (`("class",)`, `("config", "k")`): the error
    message then names that field and its line, not the whole table. `errors`
    carries a nested model's own validation errors (their `loc` relative to `path`).
    """

    def __init__(
        self, path: tuple[str | int, ...], message: str, errors: list[Any] | None = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.errors = errors or []


def field_key(name: str, info: FieldInfo) -> str:
    """The key a field is written as in TOML: its alias when it has one (`class`)."""
    return info.alias or name


def fields_by_key(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields by the key a config file writes them as."""
    return {field_key(name, info): info for name, info in model.model_fields.items()}


#: the strategies whose checkpoints are one learner's parts (the model and optimizer by
#: parameter name, sharded or not: `checkpoint/sharded.py`), so each resumes the others'
LEARNERS = ("local", "data_parallel", "tensor_parallel", "fully_sharded", "hybrid")


def task_section(config: Any) -> Any:
    """The task's own validated settings: `[task]`, or its `config` table when the task is a
    class named by dotted path (`type = "custom"`)."""
    task = config.task
    return task.config if getattr(task, "type", None) == "custom" else task


class StrategySection(ConfigModel):
    """The base of `[strategy]` sections: the job's shape (`shape/job.py`), and the rules of
    strategies that run shoal's shared training loop.

    The defaults describe replicas: `workers_field` workers (one process without it), every
    rank a worker. A strategy with other roles (servers, a mesh, hosted clients) says so in
    `roles`, and one whose resizing is more than a worker count in `without_rank` and
    `fitted`."""

    #: the field `--workers N` sets (None: the strategy runs one process)
    workers_field: ClassVar[str | None] = None
    #: its loop builds the model through the step loop, so `[train]`'s per-block options
    #: (activation checkpointing, compile) apply under it
    block_options: ClassVar[bool] = False
    #: whether the job may go on with fewer workers than it started with, resumed from the
    #: same state, and still train the same problem (`[faults] min_workers`)
    elastic: ClassVar[bool] = False
    #: whether a job of one process may run inside the calling process
    in_process: ClassVar[bool] = False
    #: strategy types whose checkpoints this one resumes from (the same parts, in a layout
    #: this one loads); empty: only its own type's
    resumes_from: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------ the batches
    def smallest_step_batch(self, train: Any) -> tuple[int, str]:
        """The fewest samples one step of this strategy can train on (`train`: the job's
        `[train]`), and why: an epoch's last batch shorter than that is dropped, with one
        notice (the step loop). Replicas train any batch of at least one sample."""
        return 1, ""

    # ------------------------------------------------------------ the shape
    def worker_count(self) -> int:
        """Worker processes this section asks for."""
        return int(getattr(self, self.workers_field)) if self.workers_field else 1

    def roles(self, hosts: Hosts | None) -> RankRoles:
        """Which rank does what; `hosts`: the machines, where placement follows them."""
        return RankRoles.replicas(self.worker_count())

    def rank_labels(self, roles: RankRoles) -> tuple[str, ...]:
        """How failure messages name each rank (empty: "rank r")."""
        return ()

    def shape(self, config: Any, hosts: Hosts | None = None) -> JobShape:
        """The job's shape under this section (`config`: the whole job, for rules that
        read other sections, such as `[faults]`)."""
        roles = self.roles(hosts)
        return JobShape(
            roles,
            {"workers": len(roles.workers)},
            in_process=self.in_process,
            elastic=self.elastic,
            labels=self.rank_labels(roles),
        )

    # ------------------------------------------------------------ resizing
    def with_workers(self, workers: int) -> Self:
        """This section with `workers` worker processes (`--workers`)."""
        if self.workers_field is None:
            if workers == self.worker_count():
                return self
            name = getattr(self, "type", "?")
            if self.worker_count() > 1:  # a mesh whose sizes are its own fields
                raise ConfigError(
                    f"--workers {workers}: strategy '{name}' sets its {self.worker_count()} "
                    "processes in its own fields; change them instead"
                )
            raise ConfigError(
                f"--workers {workers}: strategy '{name}' runs one process; set "
                '[strategy] type = "data_parallel" to train on several workers'
            )
        return self.model_copy(update={self.workers_field: workers})

    def without_rank(self, config: Any, rank: int) -> Shrink | None:
        """The job without `rank`, given up (an `elastic` strategy, `[faults] min_workers`):
        one worker fewer, the same global batch. None: that would go below the floor (the
        job restarts with every rank)."""
        workers = self.worker_count() - 1
        floor = config.faults.min_workers
        if workers < floor:
            return None
        return Shrink(
            self.with_workers(workers), {"workers": workers}, f"faults.min_workers = {floor}"
        )

    def fitted(self, config: Any, world_size: int) -> Self:
        """This section for `world_size` processes, as another launcher (torchrun, Slurm)
        started them: a host lost or back. By default the workers follow the world."""
        if self.workers_field is None:
            return self
        return self.with_workers(world_size)

    # ------------------------------------------------------------ rules
    def check(self, config: Any) -> None:
        """The shared loop needs a length: epochs, max_steps or both."""
        train = config.train
        if train.epochs is None and train.max_steps is None:
            raise FieldError(("train",), "set epochs or max_steps (or both: whichever comes first)")

    def require(self, capability: Capability[Any], config: Any) -> None:
        """Refuse, at `strategy.type`, a task that lacks what this strategy needs."""
        refusal = capability.require(config.task, str(getattr(self, "type", "?")))
        if refusal is not None:
            raise FieldError(("strategy", "type"), refusal)

    def check_task_layout(
        self, config: Any, dims: dict[str, int], fields: dict[str, tuple[str, ...]]
    ) -> None:
        """The task's own rules for its model on this strategy's mesh (`TaskSection`)."""
        check = getattr(task_section(config), "check_layout", None)
        if check is not None:
            check(dims, fields)


class TaskSection(ConfigModel):
    """The base of `[task]` sections: what the task offers the strategies that ask.

    A strategy that needs more than the base contract (a model cut into stages, rows a
    parameter server holds) asks for a capability (`protocols/capabilities.py`); the
    section answers from its settings alone, so `shoal config validate` refuses a strategy
    the task cannot serve before any worker starts."""

    #: the capabilities this task's class implements, whatever its settings
    offers: ClassVar[frozenset[Capability[Any]]] = frozenset()
    #: the metric that picks the best model and stops early, and its direction
    primary_metric: ClassVar[tuple[str, str]] = ("loss", "min")
    #: parameters that may change while a model trains (population-based training tunes
    #: them), by name, with the range [low, high) of values they accept
    tunable: ClassVar[dict[str, tuple[float, float]]] = {}

    def lacks(self, capability: Capability[Any]) -> str | None:
        """Why this task, so configured, cannot offer `capability` (None: it can)."""
        if capability in self.offers:
            return None
        return capability.not_offered(self)

    def pipeline_block_names(self) -> list[str] | None:
        """The paths of the blocks its model cuts into, when the settings say (None: known
        once built)."""
        return None

    def memory_needs(self) -> list[tuple[str, int, int]]:
        """What one process of this task holds before its first step, from the settings and
        the data files' sizes alone (`launch/memory.py` adds them up): (what, bytes of data,
        parameters of the model) per item. Empty: not estimated."""
        return []

    def table_shapes(self) -> dict[str, tuple[int, int]]:
        """(rows, width) of each embedding table of its model, from the settings and the
        data's manifest: what a parameter server spreads over its servers and every other
        strategy holds whole in each process (`launch/memory.py` places them). Empty: no
        such tables, or not known before the job starts."""
        return {}

    def meta_model(self) -> Any:
        """Its model built on the meta device, to check names against (None: not before it
        trains)."""
        return None

    def check_layout(self, dims: dict[str, int], fields: dict[str, tuple[str, ...]]) -> None:
        """Rules of this task's model laid out on a mesh of `dims` ({"tensor": 2, ...}; a
        pipeline counts its stages): raise `FieldError` at the task's field to blame, or at
        the strategy field that sets a dimension (`fields[dim]`)."""
