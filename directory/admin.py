"""Directory identities in the admin, read-only: the directory is what changes them."""

from __future__ import annotations

from django.contrib import admin

from directory.models import DirectoryIdentity


@admin.register(DirectoryIdentity)
class DirectoryIdentityAdmin(admin.ModelAdmin):
    list_display = (
        "user",
        "provider",
        "subject",
        "distinguished_name",
        "last_signed_in_at",
        "last_synced_at",
        "gone_at",
    )
    list_filter = ("provider",)
    search_fields = ("user__username", "subject", "distinguished_name")
    list_select_related = ("user",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
