"""Settings of the tests' OpenID Connect provider; its folder is PROVIDER_DIR."""

import os
from pathlib import Path

PROVIDER_DIR = Path(os.environ["PROVIDER_DIR"])
SECRET_KEY = "the test provider's own key, not a secret"  # noqa: S105
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.directory.oidc_provider.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [Path(__file__).resolve().parent / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": PROVIDER_DIR / "provider.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
USE_TZ = True
LOGIN_URL = "/accounts/login/"
SESSION_COOKIE_NAME = "provider_session"  # the appliance's is on the same host (127.0.0.1)
CSRF_COOKIE_NAME = "provider_csrftoken"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": (PROVIDER_DIR / "signing.key").read_text()
    if (PROVIDER_DIR / "signing.key").exists()
    else "",
    "PKCE_REQUIRED": True,  # a client that does not send a PKCE challenge is refused
    "OAUTH2_VALIDATOR_CLASS": "tests.directory.oidc_provider.validator.GroupsValidator",
    "SCOPES": {"openid": "OpenID Connect", "profile": "profile", "email": "e-mail"},
}
