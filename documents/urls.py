from django.urls import path

from documents import views

app_name = "documents"

urlpatterns = [
    path("", views.library, name="library"),
    path("search", views.search, name="search"),
    path("<int:document_id>/", views.detail, name="detail"),
    path("<int:document_id>/status", views.status, name="status"),
    path("<int:document_id>/share", views.share, name="share"),
    path("<int:document_id>/delete", views.delete, name="delete"),
    path("<int:document_id>/download", views.download, name="download"),
    path("<int:document_id>/cancel", views.cancel, name="cancel"),
    path("batches/", views.batches, name="batches"),
    path("batches/<int:batch_id>/", views.batch, name="batch"),
    path("batches/<int:batch_id>/progress", views.batch_progress, name="batch_progress"),
    path("batches/<int:batch_id>/cancel", views.batch_cancel, name="batch_cancel"),
]
