from django.core.management.base import BaseCommand

from inference.engine.host import EngineConfig, run


class Command(BaseCommand):
    help = "Run the engine host: load the model into vLLM once and serve the workers over a Unix socket."

    def handle(self, *args, **options):
        run(EngineConfig.from_settings())
