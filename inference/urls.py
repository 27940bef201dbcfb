from django.urls import path

from inference import views

app_name = "inference"

urlpatterns = [
    path("documents/<int:document_id>/summarise", views.summarise, name="summarise"),
    path("documents/<int:document_id>/clauses", views.extract_clauses, name="extract_clauses"),
    path("draft", views.draft_new, name="draft_new"),
    path("jobs/", views.job_list, name="jobs"),
    path("jobs/rows", views.job_rows, name="job_rows"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job"),
    path("jobs/<uuid:job_id>/retry", views.job_retry, name="job_retry"),
    path("jobs/<uuid:job_id>/regenerate", views.draft_regenerate, name="draft_regenerate"),
    path("jobs/<uuid:job_id>/edit", views.draft_edit, name="draft_edit"),
    path("jobs/<uuid:job_id>/clauses.<str:fmt>", views.clauses_export, name="clauses_export"),
    path("jobs/<uuid:job_id>/export.<str:fmt>", views.job_export, name="job_export"),
    path("jobs/<uuid:job_id>/events", views.job_events, name="job_events"),
    path("jobs/<uuid:job_id>/cancel", views.job_cancel, name="job_cancel"),
]
