from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from appliance.health import healthz
from appliance.metrics import metrics

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="documents:library", permanent=False)),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("console/", include("console.urls")),
    path("documents/", include("documents.urls")),
    path("", include("inference.urls")),
]
