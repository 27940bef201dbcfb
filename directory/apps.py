from django.apps import AppConfig


class DirectoryConfig(AppConfig):
    name = "directory"
    verbose_name = "Directory sign-in"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from directory import checks  # noqa: F401 (registers the deploy check)
