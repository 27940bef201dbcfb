"""The Celery application. Queues: ``ingest`` (CPU: parse, chunk, embed), ``prefill`` (document
jobs) and ``decode`` (drafting, chat). Each runs in its own worker pool with its own cap."""

import logging
import os
import threading
from collections.abc import Callable

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

app = Celery("appliance")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _connections_of_a_prefork_worker(sender=None, **kwargs) -> None:
    from appliance.database import unpooled_in_prefork_worker

    unpooled_in_prefork_worker(getattr(sender, "pool_cls", ""))


def worker_pool(nodename: str) -> str:
    """The pool a worker serves, from its node name: ``ingest@host``, ``prefill@host``,
    ``decode@host``, those of a node's further engines (``prefill-1@host``) or of a benchmark
    (``decode-bench@host``)."""
    return nodename.split("@", 1)[0].split("-", 1)[0]


class Watchdog:
    """A thread of a worker that runs ``sweep`` at once and then every ``interval_s`` until
    ``stop``, with the thread's database connections closed around each round (a round that
    fails is logged, and the next one tries again)."""

    def __init__(self, name: str, sweep: Callable[[], object]) -> None:
        self.name = name
        self.sweep = sweep
        self._stop = threading.Event()

    def start(self, interval_s: float) -> None:
        self._stop.clear()
        threading.Thread(target=self._run, args=(interval_s,), name=self.name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, interval_s: float) -> None:
        from django.db import close_old_connections

        while True:
            try:
                close_old_connections()
                self.sweep()
            except Exception:
                logging.getLogger(__name__).exception("%s: the round failed; the next one tries again", self.name)
            finally:
                close_old_connections()
            if self._stop.wait(interval_s):
                return
