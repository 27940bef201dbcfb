from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from api.site import api
from api.views import api_not_found, openapi_schema, problem_type
from appliance.health import healthz
from appliance.metrics import metrics
from appliance.signin import SignInView

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="documents:library", permanent=False)),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("accounts/login/", SignInView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # OpenID Connect: oidc/authenticate/ (to the provider) and oidc/callback/ (directory/oidc.py).
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("admin/", admin.site.urls),
    path("console/", include("console.urls")),
    path("documents/", include("documents.urls")),
    path("", include("inference.urls")),
    path("account/tokens/", include("api.urls")),
    path("api/problems/<slug:code>", problem_type, name="problem-type"),
    path("api/schema", openapi_schema, name="openapi-schema"),  # before the docs' own, which is staff-only
    path("", api.urls),
    # Anything else under the API's prefixes answers in the API's format, not with an HTML page.
    re_path(r"^(?:api|v1)/", api_not_found),
]
