"""API keys: who is calling, and what they may do.

A key is ``sk-steward-`` and 256 random bits, shown once by ``steward keys add``. The key
file (``auth.keys_file``) keeps only the SHA-256 of each key, beside its name and limits:

    {"version": 1, "keys": [{"name": "agents", "hash": "<64 hex digits>", "models": ["chat"],
      "classes": ["background"], "default_class": "background", "rpm": 30, "concurrency": 2,
      "admin": false, "created": "2025-06-01T12:00:00Z"}]}

The file is read by the running steward (``supervisor.auth.watch``) and written by the
``steward keys`` command, never both ways at once: a writer takes ``<keys_file>.lock`` (flock),
writes a temporary file in the same folder and renames it over the old one, so a reader sees
the old file or the new one, never half of one. Like ssh with its private keys, the loader
refuses a file that others may read.

A key's ``models`` limit it on every listener: the models and aliases it names, by the name the
client sends (a chat, an embedding, an image model on ``/v1/images/generations``, an Ollama
model). The ComfyUI listener runs whatever workflow a client posts: any checkpoint, any node,
more than any one image model can do. So it has a name of its own there, the scope ``comfyui``
(``COMFYUI_SCOPE``; no model may take that name while a comfyui section is configured): a key
with a models list reaches the ComfyUI listener only if the list names ``comfyui``, and naming
``comfyui`` opens that listener only, not the image models of ``/v1/images/generations``. A key
without a models list reaches everything.

Nothing here writes a key in clear: not the file, not an error message, not a repr.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NewType, get_args, get_origin

import attrs
import cattrs

from supervisor.config import COMFYUI_SCOPE, PositiveInt, make_converter
from supervisor.request_class import RequestClass
from supervisor.units import show

KEY_PREFIX = "sk-steward-"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Anything that looks like a key is masked in error messages: someone may paste one into the file.
_KEY_TEXT = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]+")
_MAX_FILE_SIZE = 16 * 1024**2  # far beyond any key file; a bigger one is not ours

KeyName = NewType("KeyName", str)
KeyHash = NewType("KeyHash", str)  # SHA-256 of the key text, 64 lowercase hex digits
Money = NewType("Money", float)  # a spend budget: positive, finite, below MONEY_LIMIT
MONEY_LIMIT = 1e12  # far beyond any home lab's budget; a bigger one is a typo


class KeyFileError(Exception):
    """The key file cannot be read or is invalid; the message names the file and each problem."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = [masked(problem) for problem in problems]
        super().__init__("\n".join(f"{self.path}: {problem}" for problem in self.problems))


class KeyCommandError(Exception):
    """A ``steward keys`` request that cannot be done: a name taken, no such key, a bad option."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = [masked(problem) for problem in problems]
        super().__init__("\n".join(self.problems))


def masked(text: str) -> str:
    """*text* with anything that looks like a key cut to its prefix."""
    return _KEY_TEXT.sub(KEY_PREFIX + "...", text)


@attrs.frozen(kw_only=True)
class ApiKey:
    """One key's name and what it may do. ``None`` limits nothing: all models, all classes, no rate cap."""

    name: KeyName
    hash: KeyHash = attrs.field(repr=False)
    models: tuple[str, ...] | None = None  # names as the client sends them (a model or an alias), or COMFYUI_SCOPE
    classes: tuple[RequestClass, ...] | None = None
    default_class: RequestClass | None = None
    rpm: PositiveInt | None = None  # requests per minute (any 60 s)
    concurrency: PositiveInt | None = None  # requests at once
    admin: bool = False
    # Remote models (a cloud: the request leaves the house): True forbids them (--no-remote), False
    # allows them (--remote); None: only those its models list names.
    no_remote: bool | None = None
    created: datetime
    # Budgets (supervisor/auth/budgets.py): calendar day and month, UTC; None: no budget.
    tokens_per_day: PositiveInt | None = None
    tokens_per_month: PositiveInt | None = None
    requests_per_day: PositiveInt | None = None
    spend_per_month: Money | None = None  # remote models' cost, in the currency their prices are in

    @property
    def allowed_classes(self) -> tuple[RequestClass, ...]:
        """The classes it may ask for, highest rank first."""
        return tuple(klass for klass in RequestClass if self.classes is None or klass in self.classes)

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def may_reach_remote(self) -> bool:
        """Whether its requests may go to a remote model (which may_use limits besides)."""
        return self.models is not None if self.no_remote is None else not self.no_remote

    @property
    def reaches_comfyui(self) -> bool:
        """Whether it may use the ComfyUI listener: with all models, or a models list naming ``comfyui``."""
        return self.models is None or COMFYUI_SCOPE in self.models

    def may_ask(self, klass: RequestClass) -> bool:
        return klass in self.allowed_classes

    def default_class_or(self, listener_default: RequestClass) -> RequestClass:
        """The class of a request that names none: the key's own default, else the listener's if the
        key may ask for it, else the key's highest-ranked class."""
        if self.default_class is not None:
            return self.default_class
        return listener_default if self.may_ask(listener_default) else self.allowed_classes[0]


@attrs.frozen
class KeyFile:
    """The key file's content."""

    version: Literal[1] = 1
    keys: tuple[ApiKey, ...] = ()

    def named(self, name: str) -> ApiKey | None:
        return next((key for key in self.keys if key.name == name), None)


@attrs.frozen
class KeyTable:
    """What the door looks keys up in; built once per load of the key file."""

    keys: tuple[ApiKey, ...]
    _digests: tuple[bytes, ...] = attrs.field(alias="digests", repr=False)
    _by_name: dict[str, ApiKey] = attrs.field(alias="by_name", repr=False, eq=False)

    @classmethod
    def from_key_file(cls, key_file: KeyFile) -> KeyTable:
        return cls(keys=key_file.keys, digests=tuple(bytes.fromhex(key.hash) for key in key_file.keys),
                   by_name={key.name: key for key in key_file.keys})

    @property
    def empty(self) -> bool:
        return not self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, name: str) -> ApiKey | None:
        return self._by_name.get(name)

    def lookup(self, presented: str) -> ApiKey | None:
        """The key whose text is *presented*, or None. Every stored digest is compared, in constant
        time, whichever matches: the time taken says nothing about which key (if any) it was."""
        digest = hashlib.sha256(presented.encode("utf-8", "replace")).digest()
        found = None
        for key, stored in zip(self.keys, self._digests, strict=True):
            if hmac.compare_digest(stored, digest):
                found = key
        return found


def new_key_text() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(text: str) -> str:
    # A plain SHA-256, not bcrypt or argon2: those slow down guessing low-entropy passwords, but a
    # key is 256 random bits that no one can guess, so a fast hash of it is as safe to store.
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- reading and writing the file ------------------------------------------------------------------------


def load_key_file(path: str | Path) -> KeyFile:
    """The key file at *path*; a missing file is an empty one. Raises KeyFileError."""
    try:
        # O_NONBLOCK: a FIFO put there must not hang steward; on a regular file it changes nothing.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return KeyFile()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise KeyFileError(path, [f"cannot read the key file: {getattr(exc, 'strerror', None) or exc}"]) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(path, ["cannot read the key file: not a regular file"])
        data = _read_at_most(fd, _MAX_FILE_SIZE + 1)
    except OSError as exc:
        raise KeyFileError(path, [f"cannot read the key file: {exc.strerror or exc}"]) from None
    finally:
        os.close(fd)
    if mode & 0o077:
        raise KeyFileError(path, [f"others may read or write it (mode {mode & 0o777:04o}); it holds key hashes, "
                                  f"so steward refuses it: run chmod 600 {path}"])
    if len(data) > _MAX_FILE_SIZE:
        raise KeyFileError(path, [f"larger than {_MAX_FILE_SIZE // 1024**2} MiB: not a steward key file"])
    return parse_key_file(data, path)


def parse_key_file(data: bytes, path: str | Path) -> KeyFile:
    try:
        raw = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise KeyFileError(path, [f"not UTF-8 text (byte {exc.start})"]) from None
    except RecursionError:
        raise KeyFileError(path, ["not valid JSON: nested too deeply"]) from None
    except ValueError as exc:  # JSONDecodeError, a key given twice, an integer of 5,000 digits
        raise KeyFileError(path, [f"not valid JSON: {exc}"]) from None
    try:
        key_file = _converter.structure(raw, KeyFile)
    except (cattrs.BaseValidationError, ValueError) as exc:
        raise KeyFileError(path, _describe(exc)) from None
    problems = _file_problems(key_file)
    if problems:
        raise KeyFileError(path, problems)
    return key_file


def write_key_file(path: str | Path, key_file: KeyFile) -> None:
    """Replace the file at *path* atomically with *key_file*, mode 0600. Raises KeyFileError."""
    path = Path(path)
    raw = _converter.unstructure(key_file)
    for key in raw["keys"]:  # a key without a budget reads as before budgets existed
        for field in BUDGET_FIELDS:
            if key.get(field) is None:
                key.pop(field, None)
    text = json.dumps(raw, indent=2) + "\n"
    try:
        # mkstemp creates the file with O_EXCL and mode 0600: it is never readable by others.
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise KeyFileError(path, [f"cannot write the key file: {exc.strerror or exc}"]) from None
    try:
        with open(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise KeyFileError(path, [f"cannot write the key file: {exc.strerror or exc}"]) from None
    _sync_folder(path.parent)


@contextlib.contextmanager
def locked_key_file(path: str | Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (flock): one ``steward keys`` at a time changes the file."""
    lock_path = f"{path}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise KeyFileError(path, [f"cannot open the lock file {lock_path}: {exc.strerror or exc}"]) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# --- what `steward keys` does -----------------------------------------------------------------------------


def add_key(path: str | Path, name: str, *, models: Collection[str] | None = None,
            classes: Collection[str] | None = None, default_class: str | None = None, rpm: int | None = None,
            concurrency: int | None = None, admin: bool = False, known_models: Collection[str] = (),
            ollama: bool = False, budgets: Mapping[str, float] | None = None, now: datetime | None = None,
            no_remote: bool | None = None) -> str:
    """Add a key named *name* to the key file at *path*; returns the key text, which nothing keeps.

    *known_models* are the names the config accepts (``config.alias_table()``, and ``comfyui`` with a
    ComfyUI listener); with *ollama*, other names are accepted too (they may be Ollama's own).
    *budgets* maps a budget's field (``tokens_per_day``, ...) to its limit.
    Raises KeyCommandError or KeyFileError."""
    allowed, problems = _allowed_classes(classes)
    budgets = dict(budgets or {})
    problems = _name_problems(name) + _limit_problems(rpm, concurrency) + _budget_problems(budgets) + problems
    if default_class is not None and default_class not in (allowed or tuple(RequestClass)):
        problems.append(f"--default-class: {show(default_class)} is not one of the key's classes "
                        f"({', '.join(allowed or RequestClass)})")
    if models is not None:
        models = tuple(dict.fromkeys(models))
        problems += _model_problems(models, known_models, ollama)
    if problems:
        raise KeyCommandError(problems)
    if default_class is None and allowed is not None:
        default_class = allowed[0]  # the highest-ranked class it may ask for
    text = new_key_text()
    key = ApiKey(name=KeyName(name), hash=KeyHash(key_digest(text)), models=models, classes=allowed,
                 default_class=default_class, rpm=rpm, concurrency=concurrency, admin=admin, no_remote=no_remote,
                 created=(now or datetime.now(UTC)).replace(microsecond=0), **budgets)
    with locked_key_file(path):
        key_file = load_key_file(path)
        if key_file.named(name) is not None:
            raise KeyCommandError([f"a key named {name!r} exists already: pick another name, or remove it first"])
        write_key_file(path, attrs.evolve(key_file, keys=(*key_file.keys, key)))
    return text


def remove_key(path: str | Path, name: str) -> ApiKey:
    """Remove the key named *name*; returns it. Raises KeyCommandError if there is none."""
    with locked_key_file(path):
        key_file = load_key_file(path)
        removed = key_file.named(name)
        if removed is None:
            known = ", ".join(key.name for key in key_file.keys) or "none"
            raise KeyCommandError([f"no key named {name!r} in {path} (keys: {known})"])
        write_key_file(path, attrs.evolve(key_file, keys=tuple(key for key in key_file.keys if key is not removed)))
    return removed


def list_keys(path: str | Path) -> tuple[ApiKey, ...]:
    return load_key_file(path).keys


def unknown_models(models: Collection[str], known_models: Collection[str]) -> list[str]:
    return [model for model in models if model not in known_models]


def _model_problems(models: tuple[str, ...], known_models: Collection[str], ollama: bool) -> list[str]:
    if not models:
        return ["--models: name at least one model, or leave it out for all models"]
    unknown = unknown_models(models, known_models)
    if not unknown or ollama:
        return []
    scope = f"; {COMFYUI_SCOPE}, the ComfyUI listener, needs a comfyui section" if COMFYUI_SCOPE in unknown else ""
    return [f"--models: not a model or alias in the config: {', '.join(map(show, unknown))} "
            f"(known: {', '.join(sorted(known_models)) or 'none'}{scope})"]


def _name_problems(name: str) -> list[str]:
    return [] if _is_name(name) else [f"NAME: {show(name)} is not a key name: {_NAME_RULE}"]


_NAME_RULE = f"1 to 64 letters, digits and ._- (starting with a letter or digit, not with {KEY_PREFIX})"


def _is_name(value: object) -> bool:
    # A name that looks like a key would be one, in clear in the file and the logs: pasted by mistake.
    return isinstance(value, str) and bool(NAME_PATTERN.fullmatch(value)) and not value.startswith(KEY_PREFIX)


def _limit_problems(rpm: int | None, concurrency: int | None) -> list[str]:
    return [f"--{option}: must be a positive integer, got {value}" for option, value in
            (("rpm", rpm), ("concurrency", concurrency)) if value is not None and value <= 0]


BUDGET_FIELDS = ("tokens_per_day", "tokens_per_month", "requests_per_day", "spend_per_month")


def _budget_problems(budgets: Mapping[str, float]) -> list[str]:
    """What is wrong with each budget, by the flag that set it (``--tokens-per-day``)."""
    problems = []
    for field, value in budgets.items():
        if field not in BUDGET_FIELDS:
            problems.append(f"not a budget: {show(field)} (budgets: {', '.join(BUDGET_FIELDS)})")
            continue
        structure = _structure_money if field == "spend_per_month" else _converter.get_structure_hook(PositiveInt)
        try:
            structure(value, None)
        except ValueError as exc:
            problems.append(f"--{field.replace('_', '-')}: {exc}")
    return problems


def _allowed_classes(classes: Collection[str] | None) -> tuple[tuple[RequestClass, ...] | None, list[str]]:
    """The classes in rank order (None: all), and what is wrong with them."""
    if classes is None:
        return None, []
    unknown = [klass for klass in classes if RequestClass.named(klass) is None]
    if unknown:
        return None, [f"--classes: not a class: {', '.join(map(show, unknown))} (classes: {', '.join(RequestClass)})"]
    if not classes:
        return None, ["--classes: name at least one class, or leave it out for all classes"]
    return tuple(klass for klass in RequestClass if klass in classes), []


# --- the one converter, and what it says about a bad file -------------------------------------------------


def _structure_name(value: Any, _: Any) -> str:
    if _is_name(value):
        return value
    raise ValueError(f"must be {_NAME_RULE}, got {show(value)}")


def _structure_hash(value: Any, _: Any) -> str:
    # The value is never quoted back: it might be a key pasted in by mistake.
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value):
        return value
    raise ValueError("must be the SHA-256 of the key as 64 lowercase hex digits (steward keys add writes it)")


def _structure_money(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < MONEY_LIMIT:
        return float(value)  # NaN and infinity fail the comparison
    raise ValueError(f"must be a positive amount below {MONEY_LIMIT:.0e}, like 5.00, got {show(value)}")


def _structure_time(value: Any, _: Any) -> datetime:
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        raise ValueError(f"must be an ISO-8601 time like 2025-06-01T12:00:00Z, got {show(value)}")
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _unstructure_time(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _tuple_hook(type_: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """``tuple[X, ...]`` from a JSON list (the list hook refuses a string, which cattrs would split)."""
    (item, _) = get_args(type_)
    structure_list = converter.get_structure_hook(list[item])

    def structure(value: Any, _: Any) -> tuple[Any, ...]:
        return tuple(structure_list(value, list))

    return structure


def _make_converter() -> cattrs.Converter:
    # The config's converter: its hooks already say "must be a positive integer, got 0" and refuse
    # unknown keys; the key file adds its own few types.
    converter = make_converter()
    converter.register_structure_hook(KeyName, _structure_name)
    converter.register_structure_hook(KeyHash, _structure_hash)
    converter.register_structure_hook(Money, _structure_money)
    converter.register_structure_hook(datetime, _structure_time)
    converter.register_unstructure_hook(datetime, _unstructure_time)
    converter.register_structure_hook_factory(lambda t: get_origin(t) is tuple, _tuple_hook)
    return converter


_converter = _make_converter()


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, ValueError) and str(exc).startswith("must"):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required key is missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown key{'s' if len(exc.extra_fields) > 1 else ''}: {', '.join(sorted(map(str, exc.extra_fields)))}"
    return cattrs.v.format_exception(exc, type_)


def _describe(exc: BaseException) -> list[str]:
    """cattrs' nested errors as ``keys[2].rpm: must be a positive integer, got 0`` lines."""
    problems = []
    for line in cattrs.transform_error(exc, path="", format_exception=_format_exception):
        message, _, where = line.rpartition(" @ ")
        problems.append(f"{where.lstrip('.') or '(top level)'}: {message}")
    return problems


def _file_problems(key_file: KeyFile) -> list[str]:
    problems = []
    first: dict[str, int] = {}
    for index, key in enumerate(key_file.keys):
        where = f"keys[{index}]"
        if key.name in first:
            problems.append(f"{where}.name: {key.name!r} is the name of keys[{first[key.name]}] too")
        first.setdefault(key.name, index)
        if key.classes is not None and not key.classes:
            problems.append(f"{where}.classes: must name at least one class, or be null for all classes")
        elif key.default_class is not None and key.default_class not in key.allowed_classes:
            problems.append(f"{where}.default_class: {str(key.default_class)!r} is not one of the key's classes "
                            f"({', '.join(key.allowed_classes)})")
    return problems


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = {}
    for name, value in pairs:
        if name in mapping:
            raise ValueError(f"key {show(name)} given twice in one object")
        mapping[name] = value
    return mapping


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, limit - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _sync_folder(folder: Path) -> None:
    # The rename is durable once the folder is synced; a folder that cannot be opened just misses that.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
