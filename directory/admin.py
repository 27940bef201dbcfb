"""Directory identities in the admin, read-only: the directory is what changes them. A user's page
shows the identity it is linked to, and the user list filters local and directory accounts."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import User

from directory.models import DirectoryIdentity, Provider


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


class DirectoryIdentityInline(admin.StackedInline):
    """On a user's page: the directory identity it is linked to, if any (a local account has none)."""

    model = DirectoryIdentity
    can_delete = False
    extra = 0
    max_num = 0
    fields = ("provider", "issuer", "subject", "distinguished_name", "directory_groups", "last_signed_in_at",
              "last_synced_at", "gone_at")  # fmt: skip
    readonly_fields = fields
    verbose_name_plural = "directory identity (groups, staff and superuser follow the directory's)"


class LinkedFilter(admin.SimpleListFilter):
    title = "signs in with"
    parameter_name = "directory"

    def lookups(self, request, model_admin):
        return [("local", "a local password"), *Provider.choices]

    def queryset(self, request, queryset):
        if self.value() == "local":
            return queryset.filter(directory_identity__isnull=True)
        if self.value() in Provider.values:
            return queryset.filter(directory_identity__provider=self.value())
        return queryset


class UserAdmin(DjangoUserAdmin):
    inlines = [*DjangoUserAdmin.inlines, DirectoryIdentityInline]
    list_filter = (*DjangoUserAdmin.list_filter, LinkedFilter)


admin.site.unregister(User)
admin.site.register(User, UserAdmin)
