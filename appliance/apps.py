from django.apps import AppConfig


class ApplianceConfig(AppConfig):
    name = "appliance"
    verbose_name = "Appliance"
