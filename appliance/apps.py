from django.apps import AppConfig


class ApplianceConfig(AppConfig):
    name = "appliance"
    verbose_name = "Appliance"

    def ready(self) -> None:
        from appliance import checks  # noqa: F401 (registers the middleware check)
