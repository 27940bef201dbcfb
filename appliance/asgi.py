"""ASGI entry point: the web process (uvicorn). It never imports vLLM."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from appliance.body_limit import BodySizeLimit  # noqa: E402 - after the settings module is chosen

application = BodySizeLimit(get_asgi_application())
