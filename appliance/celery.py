"""The Celery application. Queues: ``ingest`` (CPU: parse, chunk, embed), ``prefill`` (document
jobs) and ``decode`` (drafting, chat). Each runs in its own worker pool with its own cap."""

import os

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
