from django.contrib import admin, messages

from inference import services
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
    list_filter = ("kind", "queue", "state", ("api_token", admin.EmptyFieldListFilter), "created_at")
    search_fields = ("id", "owner__username", "document__title")
    list_select_related = ("owner", "document")
    readonly_fields = (
        "created_at", "started_at", "finished_at", "heartbeat_at", "attempts", "engine_crashes", "engine_waits",
        "celery_queue", "dispatched_at", "not_before", "claimed_at", "checkpoint", "api_token",
    )  # fmt: skip
    inlines = [RequestMetricsInline]
    actions = ["cancel", "retry"]

    @admin.action(description="Cancel the selected unfinished jobs", permissions=["change"])
    def cancel(self, request, queryset):
        cancelled = sum(services.job_cancel(job=job) for job in queryset.exclude(state__in=Job.FINISHED_STATES))
        self.message_user(request, f"{cancelled} job(s) cancelled.", messages.SUCCESS)

    @admin.action(
        description="Try the selected failed or cancelled jobs again (as their owners)", permissions=["change"]
    )
    def retry(self, request, queryset):
        started, refused = 0, []
        for job in queryset.filter(state__in=[Job.State.FAILED, Job.State.CANCELLED]).select_related("owner"):
            try:
                services.job_retry(job=job, user=job.owner)
                started += 1
            except (services.JobRejected, services.BrokerUnavailable) as exc:
                refused.append(f"{job.pk}: {exc}")
        self.message_user(request, f"{started} job(s) sent again.", messages.SUCCESS)
        for reason in refused[:10]:
            self.message_user(request, reason, messages.WARNING)


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
