from django.contrib import admin, messages

from documents.models import Document, Page


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
    readonly_fields = ("sha256", "size_bytes", "pages_total", "pages_done", "created_at", "updated_at")
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
