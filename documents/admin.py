from django.contrib import admin, messages
from django.db.models import Count
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from documents.models import Batch, Document, Page, Source, SourceItem


class PageInline(admin.TabularInline):
    model = Page
    extra = 0
    fields = ("number", "text")
    readonly_fields = ("number", "text")
    show_change_link = False


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "kind", "state", "pages_total", "size_bytes", "embedding_model", "created_at")
    list_filter = ("state", "kind", "source", "embedding_model", "shared_with", "created_at")
    actions = ["reembed"]
    search_fields = ("title", "filename", "sha256", "owner__username")
    list_select_related = ("owner",)
    readonly_fields = (
        "sha256", "size_bytes", "pages_total", "pages_done", "batch", "source", "source_path", "source_removed_at",
        "replaced_by", "created_at", "updated_at",
    )  # fmt: skip
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


class SourceItemInline(admin.TabularInline):
    """The files and messages a poll could not take, or found removed, with the reason."""

    model = SourceItem
    extra = 0
    max_num = 0
    can_delete = False
    fields = ("key", "state", "error", "document", "changed_at")
    readonly_fields = fields
    verbose_name_plural = "Files and messages not taken, or removed"

    def get_queryset(self, request):
        return super().get_queryset(request).exclude(state=SourceItem.State.PRESENT).order_by("-changed_at")


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    """Watched folders and IMAP mailboxes: what a source is, whose its documents become, and what
    its last poll did (or why it failed), with "Poll now"."""

    list_display = ("name", "kind", "owner", "enabled", "state", "last_result", "last_polled_at", "documents")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "folder_path", "imap_host", "imap_username", "owner__username")
    list_select_related = ("owner",)
    filter_horizontal = ("groups",)
    actions = ["poll_now", "retry_failed"]
    inlines = [SourceItemInline]
    readonly_fields = (
        "state", "last_result", "last_error", "last_polled_at", "last_success_at", "poll_started_at", "backlog",
        "imap_uidvalidity", "imap_last_uid", "created_at",
    )  # fmt: skip
    fieldsets = (
        (None, {"fields": ("name", "kind", "enabled", "owner", "groups", "poll_interval_s")}),
        ("Watched folder", {"fields": ("folder_path", "include_patterns")}),
        (
            "IMAP mailbox (read only: nothing is marked read, moved or deleted)",
            {
                "fields": (
                    "imap_host",
                    "imap_port",
                    "imap_tls",
                    "imap_ca_file",
                    "imap_username",
                    "imap_password_file",
                    "imap_mailbox",
                )
            },  # fmt: skip
        ),
        ("Last polls", {"fields": readonly_fields}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(document_count=Count("documents"))

    @admin.display(description="Documents", ordering="document_count")
    def documents(self, source: Source) -> str:
        url = reverse("admin:documents_document_changelist") + f"?source__id__exact={source.pk}"
        return format_html('<a href="{}">{}</a>', url, getattr(source, "document_count", 0))  # annotated above

    @admin.display(description="State")
    def state(self, source: Source) -> str:
        if not source.enabled:
            return "Disabled"
        if source.poll_started_at is not None:
            return f"Polling (since {timesince(source.poll_started_at)})"
        if source.last_polled_at is None:
            return "Not polled yet"
        if source.last_error:
            return f"Failed {timesince(source.last_polled_at, timezone.now())} ago: {source.last_error}"
        more = "; more to take at the next tick" if source.backlog else ""
        return f"OK, polled {timesince(source.last_polled_at, timezone.now())} ago{more}"

    @admin.action(description="Poll the selected sources now", permissions=["change"])
    def poll_now(self, request, queryset):
        from documents.source_services import source_poll_now

        enabled = list(queryset.filter(enabled=True))
        for source in enabled:
            source_poll_now(source=source)
        self.message_user(
            request,
            f"{len(enabled)} source(s) queued for a poll; refresh this page to see what it found.",
            messages.SUCCESS,
        )

    @admin.action(description="Poll the selected sources now, trying again what failed", permissions=["change"])
    def retry_failed(self, request, queryset):
        from documents.source_services import source_forget_failed, source_poll_now

        enabled = list(queryset.filter(enabled=True))
        for source in enabled:
            source_forget_failed(source=source)
            source_poll_now(source=source)
        self.message_user(
            request,
            f"{len(enabled)} source(s) queued for a poll that tries their failed files and messages again.",
            messages.SUCCESS,
        )
