"""The Celery application. Queues: ``ingest`` (CPU: parse, chunk, embed), ``prefill`` (document
jobs) and ``decode`` (drafting, chat). Each runs in its own worker pool with its own cap."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

app = Celery("appliance")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
