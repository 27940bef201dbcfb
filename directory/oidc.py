"""OpenID Connect sign-in (mozilla-django-oidc): the authorization code flow with PKCE, the
provider's endpoints read from its discovery document, the account linked by ``iss`` + ``sub``.

mozilla-django-oidc wants each endpoint as a setting; an administrator has the provider's issuer
or discovery URL (Keycloak, Entra ID and Authentik all publish one). So the endpoints are read
from ``APPLIANCE_OIDC_DISCOVERY_URL`` when first needed (not at start: the provider may be down
while the appliance starts, and local sign-in must work then) and kept for an hour.

The ID token's signature is checked against the provider's keys (RS256 by default), and its
issuer, audience and expiry here as well; the user info's ``sub`` must be the ID token's. Groups
come from the claim ``APPLIANCE_OIDC_GROUPS_CLAIM`` (user info first, then the ID token), mapped
as LDAP's are (``directory.mapping``), at every sign-in and at the sync (``oidc_sync``, Celery
beat), which presents each account's refresh token to the provider: refused, the account is
deactivated; accepted, its groups are read again from the user info. A session begun with the
provider lasts ``APPLIANCE_OIDC_SESSION_S`` at most (8 hours by default).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from directory import services
from directory.mapping import GroupPolicy
from directory.models import DirectoryIdentity, Provider

logger = logging.getLogger(__name__)

DISCOVERY_TTL_S = 3600.0
_WELL_KNOWN = "/.well-known/openid-configuration"
_discovered: dict[str, tuple[float, dict[str, Any]]] = {}
_lock = threading.Lock()

# mozilla-django-oidc's endpoint settings, and the discovery document's member for each.
_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


class DiscoveryFailed(RuntimeError):
    pass


def enabled() -> bool:
    return bool(settings.APPLIANCE_OIDC_DISCOVERY_URL)


def discovery() -> dict[str, Any]:
    """The provider's discovery document (fetched at most once an hour per process)."""
    url = settings.APPLIANCE_OIDC_DISCOVERY_URL or ""
    if not url.endswith(_WELL_KNOWN):
        url = url.rstrip("/") + _WELL_KNOWN  # an issuer URL was given
    now = time.monotonic()
    with _lock:
        cached = _discovered.get(url)
        if cached is not None and now - cached[0] < DISCOVERY_TTL_S:
            return cached[1]
    try:
        response = requests.get(url, timeout=settings.APPLIANCE_OIDC_TIMEOUT_S, verify=_verify())
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise DiscoveryFailed(f"the OpenID Connect discovery document {url} could not be read: {exc}") from exc
    missing = [member for member in (*_ENDPOINTS.values(), "issuer") if not document.get(member)]
    if missing:
        raise DiscoveryFailed(f"{url} names no {', '.join(missing)}")
    with _lock:
        _discovered[url] = (now, document)
    return document


def _verify() -> bool | str:
    return settings.APPLIANCE_OIDC_CA_FILE or True


def oidc_setting(attr: str, *args: Any) -> Any:
    """mozilla-django-oidc's settings, with the endpoints from the discovery document."""
    if attr in _ENDPOINTS:
        return discovery()[_ENDPOINTS[attr]]
    if attr == "OIDC_VERIFY_SSL":
        return _verify()
    return import_from_settings(attr, *args)


def _fernet():
    import base64
    import hashlib

    from cryptography.fernet import Fernet

    key = hashlib.sha256(b"appliance directory refresh tokens\0" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def seal(token: str) -> str:
    """A refresh token as kept in the database: encrypted and authenticated with a key derived
    from SECRET_KEY, so that a copy of the database alone does not give it."""
    return _fernet().encrypt(token.encode()).decode("ascii")


def unseal(sealed: str) -> str | None:
    from cryptography.fernet import InvalidToken

    try:
        return _fernet().decrypt(sealed.encode("ascii")).decode()
    except (InvalidToken, ValueError):
        return None  # sealed under another SECRET_KEY


def oidc_policy() -> GroupPolicy:
    return GroupPolicy(
        group_map=settings.APPLIANCE_OIDC_GROUP_MAP,
        staff_groups=settings.APPLIANCE_OIDC_STAFF_GROUPS,
        superuser_groups=settings.APPLIANCE_OIDC_SUPERUSER_GROUPS,
    )


class SignInRequestView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider (with state, nonce and a PKCE challenge)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request):
        if not enabled():
            raise Http404("OpenID Connect sign-in is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except DiscoveryFailed as exc:
            logger.error("OpenID Connect sign-in: %s", exc)
            return redirect(reverse("login") + "?oidc=unavailable")
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """The provider's answer. A session begun here lasts ``APPLIANCE_OIDC_SESSION_S`` at most, so
    that the provider is asked again even where the sync cannot ask it (no refresh token)."""

    get_settings = staticmethod(oidc_setting)

    def login_success(self):
        response = super().login_success()
        self.request.session.set_expiry(settings.APPLIANCE_OIDC_SESSION_S)
        return response


def _groups(claims: dict[str, Any]) -> tuple[str, ...]:
    value = claims.get(settings.APPLIANCE_OIDC_GROUPS_CLAIM)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    logger.warning("OpenID Connect: the claim %s is neither a list nor a string", settings.APPLIANCE_OIDC_GROUPS_CLAIM)
    return ()


class OidcBackend(OIDCAuthenticationBackend):
    """The callback's authentication: the code exchanged (with the PKCE verifier), the ID token
    verified, the appliance account of ``iss`` + ``sub`` signed in (made on its first sign-in)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Nothing is fetched here: Django makes this backend for every sign-in, local ones too.
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    @property
    def OIDC_RP_CLIENT_ID(self) -> str:  # noqa: N802 (the library's attribute names)
        return settings.OIDC_RP_CLIENT_ID

    @property
    def OIDC_RP_CLIENT_SECRET(self) -> str:  # noqa: N802
        return settings.OIDC_RP_CLIENT_SECRET

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:  # noqa: N802
        return discovery()["token_endpoint"]

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:  # noqa: N802
        return discovery()["userinfo_endpoint"]

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:  # noqa: N802
        return discovery()["jwks_uri"]

    def authenticate(self, request, **kwargs):
        if not enabled() or request is None or "code" not in request.GET:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except (DiscoveryFailed, requests.RequestException) as exc:
            logger.error("OpenID Connect sign-in failed: %s", exc)
            return None

    def verify_token(self, token, **kwargs):
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if payload.get("iss") != discovery()["issuer"]:
            raise SuspiciousOperation("the ID token's issuer is not the provider's")
        if settings.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token is not for this appliance")
        if float(payload.get("exp", 0)) < time.time():
            raise SuspiciousOperation("the ID token has expired")
        return payload

    def get_token(self, payload):
        token_info = super().get_token(payload)
        self._refresh_token = token_info.get("refresh_token") or ""
        return token_info

    def get_or_create_user(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the user info is not the ID token's subject")
        claims = {**payload, **userinfo}
        username = str(
            claims.get(settings.APPLIANCE_OIDC_USERNAME_CLAIM) or (claims.get("email") or "").split("@")[0] or ""
        )
        user = services.identity_sign_in(
            account=services.DirectoryAccount(
                provider=Provider.OIDC,
                issuer=str(payload["iss"]),
                subject=str(payload["sub"]),
                username=username[:150],
                groups=_groups(userinfo) or _groups(payload),
                email=str(claims.get("email") or ""),
                first_name=str(claims.get("given_name") or ""),
                last_name=str(claims.get("family_name") or ""),
            ),
            policy=oidc_policy(),
        )
        refresh_token = getattr(self, "_refresh_token", "")
        DirectoryIdentity.objects.filter(user=user).update(
            refresh_token_sealed=seal(refresh_token) if refresh_token else ""
        )
        return user if self.user_can_authenticate(user) else None

    def get_user(self, user_id):
        # Django's own check: an inactive account's session is not signed in.
        return ModelBackend.get_user(self, user_id)


class ProviderRefused(Exception):
    """The provider refused an account's refresh token: the account is gone or disabled there,
    or its grant was revoked."""


def _refresh(refresh_token: str) -> dict[str, Any]:
    response = requests.post(
        discovery()["token_endpoint"],
        data={
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "client_id": settings.OIDC_RP_CLIENT_ID,
            "client_secret": settings.OIDC_RP_CLIENT_SECRET,
        },
        timeout=settings.APPLIANCE_OIDC_TIMEOUT_S,
        verify=_verify(),
    )
    if response.status_code == 400:
        try:
            error = response.json().get("error", "")
        except ValueError:
            error = ""
        if error == "invalid_grant":  # this account's grant: deleted, disabled or revoked there
            raise ProviderRefused(error)
        # invalid_client, unauthorized_client, ...: the appliance's own configuration, not the
        # account's; nothing is changed (raise_for_status below stops the sync).
        logger.error(
            "OpenID Connect sync: the provider refused the appliance's request: %s", error or response.text[:200]
        )
    response.raise_for_status()
    return response.json()


def oidc_sync() -> services.SyncReport:
    """Ask the provider about every OIDC-linked account with a refresh token (the sync, every
    ``APPLIANCE_OIDC_SYNC_INTERVAL_S``): a refused refresh token deactivates the account here
    (and revokes its API tokens); an accepted one reads its groups again from the user info. A
    provider that does not answer changes nothing."""
    report = services.SyncReport()
    identities = (
        DirectoryIdentity.objects.filter(provider=Provider.OIDC, gone_at__isnull=True, user__is_active=True)
        .exclude(refresh_token_sealed="")
        .select_related("user")
    )
    policy = oidc_policy()
    for identity in identities:
        refresh_token = unseal(identity.refresh_token_sealed)
        if refresh_token is None:
            continue
        report.checked += 1
        try:
            tokens = _refresh(refresh_token)
        except ProviderRefused as exc:
            logger.warning("OpenID Connect sync: the provider refused %s's refresh token (%s)", identity.user, exc)
            services.identity_deactivate(identity=identity)
            report.deactivated.append(identity.user.username)
            continue
        except (requests.RequestException, DiscoveryFailed, ValueError) as exc:
            logger.error("OpenID Connect sync: the provider did not answer as expected; stopped: %s", exc)
            break
        new_refresh = tokens.get("refresh_token") or refresh_token
        DirectoryIdentity.objects.filter(pk=identity.pk).update(refresh_token_sealed=seal(new_refresh))
        userinfo = requests.get(
            discovery()["userinfo_endpoint"],
            headers={"Authorization": f"Bearer {tokens['access_token']}"},
            timeout=settings.APPLIANCE_OIDC_TIMEOUT_S,
            verify=_verify(),
        )
        userinfo.raise_for_status()
        claims = userinfo.json()
        if claims.get("sub") != identity.subject:
            logger.error("OpenID Connect sync: the provider answered for another subject than %s", identity.subject)
            continue
        if services.identity_refresh(identity=identity, groups=list(_groups(claims)), policy=policy):
            report.groups_changed.append(identity.user.username)
    logger.info(
        "directory: OpenID Connect sync checked %d account(s); deactivated %s; groups changed for %s",
        report.checked,
        ", ".join(report.deactivated) or "none",
        ", ".join(report.groups_changed) or "none",
    )
    return report
