"""``manage.py check``: the security, clickjacking and CSRF middleware are installed.

Django's own checks of that (``security.W001``-``W003``) look for the middleware's exact paths in
``MIDDLEWARE``; the appliance installs subclasses of them that run without a thread hop
(``appliance.middleware``), which those checks cannot see, so they are silenced in the settings
and this one asks the same question of the classes, as an error rather than a warning.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

REQUIRED = {  # Django's middleware -> what is lost without it, and the check of Django's it replaces
    "django.middleware.security.SecurityMiddleware": (
        "HSTS, nosniff, the referrer policy and the HTTPS redirect",
        "W001",
    ),
    "django.middleware.clickjacking.XFrameOptionsMiddleware": ("X-Frame-Options", "W002"),
    "django.middleware.csrf.CsrfViewMiddleware": ("the browser's CSRF protection", "W003"),
}


@checks.register(checks.Tags.security)
def security_middleware_installed(app_configs, **kwargs) -> list[checks.CheckMessage]:
    installed = [import_string(path) for path in settings.MIDDLEWARE]
    errors: list[checks.CheckMessage] = []
    for path, (what, replaces) in REQUIRED.items():
        required = import_string(path)
        if not any(isinstance(m, type) and issubclass(m, required) for m in installed):
            errors.append(
                checks.Error(
                    f"No middleware in MIDDLEWARE is {path} or a subclass of it: {what} would be lost.",
                    hint=f"Add appliance.middleware's subclass of it (this check stands in for Django's security.{replaces}).",
                    id="appliance.E001",
                )
            )
    return errors
