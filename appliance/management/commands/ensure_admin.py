import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from appliance.env import env_str


class Command(BaseCommand):
    help = (
        "Create the administrator account if there is none. The password comes from "
        "APPLIANCE_ADMIN_PASSWORD, or is generated and printed once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default=env_str("APPLIANCE_ADMIN_USER") or "admin")

    def handle(self, *args, username, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("an administrator account exists already")
            return
        password = env_str("APPLIANCE_ADMIN_PASSWORD")
        generated = password is None
        if generated:
            password = secrets.token_urlsafe(12)
        else:
            try:
                validate_password(password, User(username=username))
            except ValidationError as exc:
                raise CommandError(f"APPLIANCE_ADMIN_PASSWORD is refused: {' '.join(exc.messages)}") from None
        User.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(
                self.style.WARNING(
                    f"Created administrator '{username}' with password: {password}\n"
                    "This is shown once; change it in the admin."
                )
            )
        else:
            self.stdout.write(f"Created administrator '{username}' with the password from APPLIANCE_ADMIN_PASSWORD")
