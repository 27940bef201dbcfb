from django.urls import path

from console import views

app_name = "console"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("audit", views.audit_log, name="audit"),
    path("capacity", views.capacity, name="capacity"),
    path("specsheet", views.specsheet, name="specsheet"),
    path("specsheet/files/<str:name>", views.specsheet_file, name="specsheet_file"),
]
