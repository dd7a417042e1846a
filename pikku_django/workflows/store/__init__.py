"""The workflow tables' operations, written once per database vendor."""

from __future__ import annotations

from collections.abc import Callable

from django.db import connections

from pikku_django.workflows._values import NewStep, NextDue, Settled
from pikku_django.workflows.config import EngineConfig, engine_config
from pikku_django.workflows.store.base import (
    LimitedClaim,
    NewRun,
    WorkflowStore,
    columns,
)
from pikku_django.workflows.store.orm import OrmStore
from pikku_django.workflows.store.vendors import MysqlStore, SqliteStore


def store_for(using: str, config: Callable[[], EngineConfig] = engine_config) -> WorkflowStore:
    """The store for the database ``using``, by its vendor; ``config`` gives the
    settings it runs by."""
    vendor = connections[using].vendor
    if vendor == "postgresql":
        from pikku_django.workflows.store.postgresql import PostgresStore

        return PostgresStore(using, config)
    if vendor == "sqlite":
        return SqliteStore(using, config)
    if vendor == "mysql":
        return MysqlStore(using, config)
    return OrmStore(using, config)


__all__ = [
    "LimitedClaim",
    "MysqlStore",
    "NewRun",
    "NewStep",
    "NextDue",
    "OrmStore",
    "Settled",
    "SqliteStore",
    "WorkflowStore",
    "columns",
    "store_for",
]
