"""The document assistant appliance: Django project package."""

from appliance.celery import app as celery_app

__all__ = ["celery_app"]
