from django.contrib import admin

from inference.models import Job, RequestMetrics


class RequestMetricsInline(admin.StackedInline):
    model = RequestMetrics
    extra = 0
    can_delete = False

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in RequestMetrics._meta.fields]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "queue", "state", "owner", "document", "attempts", "created_at")
    list_filter = ("kind", "queue", "state", "created_at")
    search_fields = ("id", "owner__username", "document__title")
    list_select_related = ("owner", "document")
    readonly_fields = ("created_at", "started_at", "finished_at", "heartbeat_at", "attempts")
    inlines = [RequestMetricsInline]


@admin.register(RequestMetrics)
class RequestMetricsAdmin(admin.ModelAdmin):
    list_display = (
        "job",
        "queue",
        "ttft_ms",
        "prefill_ms",
        "decode_tokens_per_s",
        "prompt_tokens",
        "output_tokens",
        "preemptions",
        "created_at",
    )
    list_filter = ("queue", "scheduling", "created_at")
    list_select_related = ("job",)
