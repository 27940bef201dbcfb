"""``manage.py announce_node``: this node in the cluster view (``appliance.cluster``), announced every
``APPLIANCE_NODE_HEARTBEAT_S`` until SIGTERM, for a node whose processes a manager runs one by one
(deploy/: the systemd units, the Compose services, the containers of a Kubernetes pod).
``manage.py serve`` announces its node itself, from a thread beside its supervisor; this is that
thread alone. Its roles are ``--roles`` or ``APPLIANCE_ROLES``: with ``engine``, it reports every
engine of the node (``APPLIANCE_ENGINES``) at its socket.
"""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from appliance.cluster import Announcer
from appliance.env import env_str
from appliance.node_preparation import require_external_services
from appliance.supervisor import ROLES, RolesError, parse_roles


class Command(BaseCommand):
    help = "Announce this node (its roles, its engines) in the broker every few seconds, until stopped."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--roles",
            default=None,
            help=f"this node's roles, comma-separated: {', '.join(ROLES)} (default: APPLIANCE_ROLES)",
        )

    def handle(self, *args, roles: str | None = None, **options) -> None:
        try:
            parsed = parse_roles(roles if roles is not None else env_str("APPLIANCE_ROLES"))
        except RolesError as exc:
            raise CommandError(str(exc)) from exc
        require_external_services("a node announced on its own")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
        announcer = Announcer(list(parsed))
        self.stdout.write(f"announcing this node, roles: {', '.join(parsed)}")
        announcer.start()
        try:
            stop.wait()
        finally:
            announcer.stop()
