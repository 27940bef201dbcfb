"""The web UI's pages for personal API tokens (``/account/tokens/``)."""

from django.urls import path  # noqa: F401

app_name = "tokens"
urlpatterns: list = []
