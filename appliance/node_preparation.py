"""What a node does before it starts its processes, by role: the same steps for ``manage.py serve``
(every role of the node under one supervisor) and ``manage.py process`` (one process, each run by
systemd, Compose or Kubernetes on its own; deploy/).

A node with the web role owns the schema: it migrates, collects static files, makes sure an
administrator exists and queues documents whose embeddings are stale. Any other node uses the web
node's database and broker, and waits for that database to be migrated. A node with the engine
role prepares (or checks) the model first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import psycopg
from django.core.management import call_command
from django.core.management.base import CommandError

from appliance.database import close_pool, direct_connection
from appliance.env import env_str


def require_external_services(what: str) -> None:
    """``what`` (a node without the web role, one process on its own) uses the database and broker
    of the web node: refused unless ``DATABASE_URL`` and ``REDIS_URL`` (or their ``_FILE``) name them."""
    unset = [name for name in ("DATABASE_URL", "REDIS_URL") if env_str(name) is None]
    if unset:
        raise CommandError(f"{what} uses the database and broker of the web node: set {' and '.join(unset)}")


def prepare_node(roles: Sequence[str], *, write: Callable[[str], object]) -> None:
    """The steps ``roles`` need before their processes start (the module's docstring); the database
    pool it used is closed afterwards, since the processes started next have their own."""
    from documents.embeddings import model_path as embedding_model_path
    from documents.services import document_reembed_stale

    if "engine" in roles:
        call_command("prepare_model")
    try:  # a connection of its own says why, where the pool would say only "timeout"
        direct_connection(timeout_s=10).close()
    except psycopg.Error as exc:
        raise CommandError(f"the database cannot be reached: {exc}") from exc
    if "web" in roles:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("ensure_admin")
        stale = document_reembed_stale(model_name=embedding_model_path()[1])
        if stale:
            write(f"the embedding model changed: {stale} document(s) queued for re-embedding")
    elif _unapplied_migrations():
        raise CommandError("the database is not migrated yet: start the web node first (it migrates)")
    close_pool()


def _unapplied_migrations() -> bool:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    return bool(executor.migration_plan(executor.loader.graph.leaf_nodes()))
