from django.contrib import admin

from documents.models import Document, Page


class PageInline(admin.TabularInline):
    model = Page
    extra = 0
    fields = ("number", "text")
    readonly_fields = ("number", "text")
    show_change_link = False


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "state", "pages_total", "size_bytes", "created_at")
    list_filter = ("state", "created_at")
    search_fields = ("title", "filename", "sha256", "owner__username")
    list_select_related = ("owner",)
    readonly_fields = ("sha256", "size_bytes", "pages_total", "pages_done", "created_at", "updated_at")
    inlines = [PageInline]
