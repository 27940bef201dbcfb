from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine.model_prep import ModelPreparationError, check_model_dir, prepare_default_model


class Command(BaseCommand):
    help = "Convert the default model once (verified by checksum later), or check APPLIANCE_MODEL."

    def handle(self, *args, **options):
        model_dir = settings.APPLIANCE_MODEL
        try:
            if model_dir == settings.DEFAULT_MODEL_DIR:
                prepared = prepare_default_model(model_dir)
                verb = "converted" if prepared.converted else "verified"
                self.stdout.write(f"default model {verb}: {prepared.path}")
            else:
                check_model_dir(model_dir)
                self.stdout.write(f"using model directory {model_dir}")
        except ModelPreparationError as exc:
            raise CommandError(str(exc)) from exc
