"""Changes to the provider's directory, run as ``python -m tests.directory.oidc_provider.ops``:

seed <redirect_uri> <client_id> <client_secret> <users.json>   users (name, password, groups) and the client
remove-member <username> <group>
add-member <username> <group>
deactivate <username>
"""

import json
import os
import sys
from pathlib import Path

import django


def main(argv: list[str]) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.directory.oidc_provider.settings"
    django.setup()
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    command, *args = argv
    if command == "seed":
        redirect_uri, client_id, client_secret, users_file = args
        for name, (password, groups) in json.loads(Path(users_file).read_text()).items():
            user = User.objects.create_user(
                name, email=f"{name}@example.org", password=password, first_name=name.title()
            )
            for group in groups:
                user.groups.add(Group.objects.get_or_create(name=group)[0])
        Application.objects.create(
            name="Document assistant",
            client_id=client_id,
            client_secret=client_secret,
            client_type=Application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
            redirect_uris=redirect_uri,
            algorithm=Application.RS256_ALGORITHM,
            skip_authorization=True,
        )
    elif command in ("remove-member", "add-member"):
        username, group = args
        user, group_row = User.objects.get(username=username), Group.objects.get_or_create(name=group)[0]
        (user.groups.remove if command == "remove-member" else user.groups.add)(group_row)
    elif command == "delete":
        User.objects.filter(username=args[0]).delete()
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
