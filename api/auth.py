"""Who is calling, and may they do this: a personal API token (``Authorization: Bearer``), or the
browser's session. Each operation names the scope it needs:

- ``read``: list, read, search, stream, usage; ``write``: upload, share, delete, start and cancel
  jobs, chat completions; ``admin``: everyone's usage (staff only).
- A signed-in browser session holds ``read`` and ``write``, and ``admin`` if the user is staff.
  Its unsafe requests need Django's CSRF token, as any form of the site does.
- A token's requests count against its rate limit (per minute, in the broker).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja.errors import AuthenticationError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from api import ratelimit, selectors, services
from api.models import Scope
from api.problems import ApiProblem


def _insufficient(scope: str, who: str) -> ApiProblem:
    return ApiProblem(403, "insufficient-scope", f"This operation needs the {scope} scope, which {who} does not have.")


class TokenAuth(HttpBearer):
    def __init__(self, scope: str) -> None:
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, token: str):
        api_token = selectors.token_for(token)
        if api_token is None:
            return None  # unknown, revoked or expired: 401 (unless a session signs the request in)
        if not api_token.allows(self.scope):
            raise _insufficient(self.scope, f"the token “{api_token.name}”")
        retry_after_s = ratelimit.hit(api_token)
        if retry_after_s is not None:
            limit = ratelimit.limit_of(api_token)
            whose = (
                f"The token “{api_token.name}” may make {limit} requests a minute"
                if api_token.rate_limit_per_minute is not None
                else f"Your tokens may make {limit} requests a minute together (APPLIANCE_API_RATE_LIMIT_PER_MINUTE)"
            )
            raise ApiProblem(
                429,
                "rate-limited",
                f"{whose}; try again in {retry_after_s} s.",
                headers={"Retry-After": str(retry_after_s)},
            )
        services.token_mark_used(token=api_token)
        request.user = api_token.user
        # The appliance's own attribute: the token that signed the request (None for a session),
        # for the jobs it makes to carry.
        request.api_token = api_token  # type: ignore[attr-defined]
        return api_token.user


class SessionScope(APIKeyCookie):
    """The browser's session. CSRF is checked only when a session signs the request in, so that a
    tool without credentials gets 401, not a CSRF error."""

    def __init__(self, scope: str) -> None:
        self.param_name = settings.SESSION_COOKIE_NAME
        super().__init__(csrf=True)
        self.scope = scope

    def _get_key(self, request: HttpRequest):
        # No user at all on a request a bearer token signs to the API: the browsers' middleware
        # leaves it alone (appliance.middleware.BrowserOnly), so a wrong token is not a session.
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if not getattr(request, "_ninja_csrf_exempt", False) and check_csrf(request):
            raise ApiProblem(
                403,
                "forbidden",
                "The CSRF token is missing or wrong; send the csrftoken cookie's value as X-CSRFToken.",
            )
        return "session"

    def authenticate(self, request: HttpRequest, key):
        if key is None or not request.user.is_authenticated:  # _get_key gives a key only to a user
            return None
        if self.scope == Scope.ADMIN and not request.user.is_staff:
            raise _insufficient(self.scope, "your account")
        retry_after_s = ratelimit.hit_session(request.user.pk)
        if retry_after_s is not None:
            raise ApiProblem(
                429,
                "rate-limited",
                f"Your session may make {ratelimit.session_limit()} API requests a minute; "
                f"try again in {retry_after_s} s.",
                headers={"Retry-After": str(retry_after_s)},
            )
        request.api_token = None  # type: ignore[attr-defined]
        return request.user


def auth_for(scope: str) -> list:
    return [TokenAuth(scope), SessionScope(scope)]


READ = auth_for(Scope.READ)
WRITE = auth_for(Scope.WRITE)
ADMIN = auth_for(Scope.ADMIN)


def signed_in_user(request: HttpRequest) -> User:
    """The user a request to an operation with ``auth`` signed in as (a token's or the session's).
    Authentication has run by then; a request with no user is refused as authentication would."""
    user = request.user
    if not isinstance(user, User):
        raise AuthenticationError()
    return user
