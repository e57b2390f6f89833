"""``data.dataset`` to a :class:`~fedcore.data.types.Dataset`: a built-in name (listed in
:data:`fedcore.registry.DATASETS`), ``"folder:PATH"``, or a user's ``"pkg.module:factory"``.

A user factory is called as ``factory(seed=..., test_fraction=...)`` and returns a
:class:`~fedcore.data.types.Dataset`. :func:`load_object`, :func:`resolve_factory` and
:func:`refused_arguments` also serve the models' and streams' import paths.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fedcore import registry
from fedcore.config import FOLDER
from fedcore.data.folder import folder
from fedcore.data.types import Dataset
from fedcore.errors import DataError, FedcoreError
from fedcore.ids import error_text
from fedcore.registry import did_you_mean

__all__ = [
    "DATASETS",
    "load_dataset",
    "load_object",
    "refused_arguments",
    "resolve_factory",
]


class _Factories(Mapping[str, Callable[..., Dataset]]):
    """The built-in datasets' factories by name, each imported when first asked for (from the
    module :data:`fedcore.registry.DATASETS` names)."""

    def __getitem__(self, name: str) -> Callable[..., Dataset]:
        if name not in registry.DATASETS:
            raise KeyError(name)
        factory: Callable[..., Dataset] = registry.DATASETS.load(name)
        return factory

    def __iter__(self) -> Iterator[str]:
        return iter(registry.DATASETS.names)

    def __len__(self) -> int:
        return len(registry.DATASETS.names)


DATASETS: Mapping[str, Callable[..., Dataset]] = _Factories()
"""``data.dataset``'s built-in names -> their factories."""


def load_object(path: str, *, what: str) -> object:
    """Import ``"pkg.module:attribute"`` (or a plain ``"module:attribute"``: a module
    file, no package) and return the attribute, through the one resolver of every family's
    import paths (:func:`fedcore.registry.import_object`).

    Raises:
        DataError: naming the path and what went wrong (bad form, import, attribute).
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise DataError(f"{what} {path!r} is neither a built-in name nor 'pkg.module:factory'.")
    try:
        return registry.import_object(path, what=what, error=DataError)
    except DataError as exc:
        cause = exc.__cause__
        if not isinstance(cause, ImportError):
            raise
        # A module that does not import: say where fedcore looks (the folder it runs from).
        missing = cause.name or ""
        where = ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            where = (
                f" (fedcore looks in the folder it runs from and on PYTHONPATH: run it from "
                f"the folder that holds {missing.replace('.', '/')}.py or "
                f"{missing.replace('.', '/')}/, or put that folder on PYTHONPATH)"
            )
        raise DataError(
            f"cannot import module {module_name!r} for {what} {path!r}: {cause}{where}."
        ) from cause


def resolve_factory(
    name: str, registry: Mapping[str, Callable[..., Any]], *, what: str
) -> Callable[..., Any]:
    """The factory registered as ``name``, or the callable at import path ``name``.

    Raises:
        DataError: an unknown built-in name (listing the known ones) or a bad import path.
    """
    factory = registry.get(name)
    if factory is not None:
        return factory
    if ":" not in name:
        hint = did_you_mean(name, registry)
        raise DataError(
            f"unknown {what} {name!r}"
            + (f"; {hint}" if hint else "")
            + f" (built-in {what}s: {', '.join(sorted(registry))}, or give your own as "
            "'pkg.module:factory')."
        )
    loaded = load_object(name, what=what)
    if not callable(loaded):
        raise DataError(f"{what} {name!r} is not callable.")
    return loaded


def refused_arguments(factory: Callable[..., Any], **kwargs: Any) -> TypeError | None:
    """The TypeError that calling ``factory(**kwargs)`` raises for its signature alone, or
    None (also when the signature cannot be read). Tells a factory called wrongly from
    one that fails inside."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        return exc
    return None


def load_dataset(name: str, *, seed: int, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """Return the built-in dataset ``name`` or call a user factory given by import path.

    The datasets read from files (``cifar10``, ``femnist``, ...) look in ``root``
    (``data.root``; :func:`fedcore.data.files.data_root` says the default);
    ``"folder:PATH"`` reads ``PATH`` as written.

    Whatever a factory raises becomes a :class:`DataError` naming it and its error,
    chained to the original (whose traceback ``fedcore -v`` shows).

    Raises:
        DataError: unknown name, a factory with the wrong signature, one that fails or
            returns no :class:`Dataset`.
    """
    if name.startswith(FOLDER):
        return folder(name[len(FOLDER) :], seed=seed, test_fraction=test_fraction)
    factory = resolve_factory(name, DATASETS, what="dataset")
    if name in registry.DATASETS and "root" in registry.DATASETS.entry(name).keys:
        return factory(seed=seed, test_fraction=test_fraction, root=root)  # type: ignore[no-any-return]
    refused = refused_arguments(factory, seed=seed, test_fraction=test_fraction)
    if refused is not None:
        raise DataError(
            f"dataset {name!r} must accept keyword arguments seed and test_fraction: {refused}."
        )
    try:
        dataset = factory(seed=seed, test_fraction=test_fraction)
    except FedcoreError:
        raise
    except Exception as exc:  # a user's factory can raise anything
        raise DataError(f"dataset factory {name!r} failed: {error_text(exc)}") from exc
    if not isinstance(dataset, Dataset):
        raise DataError(
            f"dataset factory {name!r} returned {type(dataset).__name__}, not fedcore.data.Dataset."
        )
    return dataset
