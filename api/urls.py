"""The web UI's pages for personal API tokens (``/account/tokens/``)."""

from django.urls import path

from api import token_views

app_name = "tokens"
urlpatterns = [
    path("", token_views.tokens, name="list"),
    path("<int:token_id>/revoke", token_views.revoke, name="revoke"),
]
