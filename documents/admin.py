from django.contrib import admin, messages

from documents.models import Batch, Document, Page


class PageInline(admin.TabularInline):
    model = Page
    extra = 0
    fields = ("number", "text")
    readonly_fields = ("number", "text")
    show_change_link = False


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "kind", "state", "pages_total", "size_bytes", "embedding_model", "created_at")
    list_filter = ("state", "kind", "embedding_model", "shared_with", "created_at")
    actions = ["reembed"]
    search_fields = ("title", "filename", "sha256", "owner__username")
    list_select_related = ("owner",)
    readonly_fields = ("sha256", "size_bytes", "pages_total", "pages_done", "batch", "created_at", "updated_at")
    inlines = [PageInline]

    @admin.action(description="Re-embed the selected ready documents (search index)", permissions=["change"])
    def reembed(self, request, queryset):
        from documents.tasks import embed_document

        ready = list(queryset.filter(state=Document.State.READY).values_list("pk", flat=True))
        for document_id in ready:
            embed_document.delay(document_id)
        skipped = queryset.count() - len(ready)
        self.message_user(
            request,
            f"{len(ready)} document(s) queued for re-embedding"
            + (f"; {skipped} not ready, left alone." if skipped else "."),
            messages.SUCCESS,
        )


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    """Batches are made by uploads, not here; an administrator can see them and stop one."""

    list_display = ("name", "owner", "state", "files_total", "files_skipped", "created_at", "finished_at")
    list_filter = ("state", "created_at")
    search_fields = ("name", "owner__username")
    list_select_related = ("owner",)
    readonly_fields = ("owner", "name", "state", "files_total", "files_skipped", "skipped", "created_at", "finished_at")
    actions = ["cancel"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Cancel the selected batches (what is done stays)", permissions=["change"])
    def cancel(self, request, queryset):
        from documents.batch_services import batch_cancel

        cancelled = sum(batch_cancel(batch=batch, user=batch.owner) for batch in queryset.select_related("owner"))
        self.message_user(request, f"{cancelled} batch(es) cancelled.", messages.SUCCESS)
