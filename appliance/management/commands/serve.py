import signal
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from appliance import cpus
from appliance.cluster import Announcer
from appliance.embedded import embedded_services
from appliance.env import env_int, env_str
from appliance.node_preparation import prepare_node, require_external_services
from appliance.supervisor import (
    ROLES,
    AlreadyServing,
    RolesError,
    ServeLock,
    Supervisor,
    appliance_processes,
    parse_roles,
)
from inference.engine.client import EngineClient, EngineRequestError, EngineUnavailable
from inference.engine.protocol import EngineState


class Command(BaseCommand):
    help = (
        "Run the appliance on this box (what `make run` does): every role, or those of --roles. "
        "Ctrl-C stops everything it started."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=env_int("APPLIANCE_PORT", 8000, minimum=1, maximum=65535))
        parser.add_argument(
            "--roles",
            default=None,
            help=f"the roles this node runs, comma-separated: {', '.join(ROLES)} (default: APPLIANCE_ROLES, else all)",
        )

    def handle(self, *args, port, roles=None, **options):
        try:
            roles = parse_roles(roles if roles is not None else env_str("APPLIANCE_ROLES"))
        except RolesError as exc:
            raise CommandError(str(exc)) from exc
        web, engine = "web" in roles, "engine" in roles
        if not web:
            # The web node owns the schema and, on one box, the embedded services: any other node
            # uses those of the web node.
            require_external_services("a node without the web role")
        lock = ServeLock(settings.VAR_DIR)
        try:
            lock.acquire()
        except AlreadyServing as exc:
            raise CommandError(str(exc)) from exc
        try:
            self._serve(roles, port, web=web, engine=engine)
        finally:
            lock.release()

    def _serve(
        self, roles, port, *, web, engine
    ):  # unannotated, as handle() was: the services' types are checked in their module
        self.stdout.write(f"roles: {', '.join(roles)}")
        # The embedded services this command starts, and so watches and stops; an external
        # DATABASE_URL / REDIS_URL, or a server someone else left running, is not its to restart.
        started_services = []
        postgres, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
        wanted = [(postgres, "DATABASE_URL"), (valkey, "REDIS_URL")]
        try:
            for service, variable in wanted:
                if env_str(variable) is not None:
                    continue
                self.stdout.write(f"{service.name} on 127.0.0.1:{service.port} (data in {service.data_dir})")
                if service.start():
                    started_services.append(service)
                else:
                    self.stdout.write(
                        self.style.WARNING(f"{service.name} was already running: used, but not watched or stopped")
                    )
        except BaseException:
            for service in reversed(started_services):
                service.stop()
            raise

        supervisor = None
        announcer: Announcer | None = None
        try:
            prepare_node(roles, write=self.stdout.write)  # the model, the schema (appliance/node_preparation.py)
            specs = appliance_processes(python=sys.executable, port=port, settings=settings, roles=roles)
            supervisor = Supervisor(
                specs, cwd=settings.BASE_DIR, services=started_services, service_cpus=cpus.service_cpus(settings)
            )
            stop = {"requested": False}

            def request_stop(signum, frame):
                stop["requested"] = True

            signal.signal(signal.SIGINT, request_stop)
            signal.signal(signal.SIGTERM, request_stop)
            supervisor.start_all()
            announcer = Announcer(list(roles))  # this node in the cluster view, every few seconds
            announcer.start()
            url = f"http://127.0.0.1:{port}/"
            announced_web, announced_engine = not web, not engine
            while not stop["requested"]:
                supervisor.poll_once()
                if not announced_web and _answers(url + "healthz"):
                    self.stdout.write(self.style.SUCCESS(f"The appliance is serving at {url}  (Ctrl-C stops it)"))
                    self.stdout.write("The engine is loading the model; jobs wait in their queues until it is ready.")
                    announced_web = True
                if announced_web and not announced_engine and _engine_ready():
                    self.stdout.write(
                        self.style.SUCCESS(f"The engine is ready. Open {url}" if web else "The engine is ready.")
                    )
                    announced_engine = True
                time.sleep(0.5)
            self.stdout.write("stopping the appliance...")
        finally:
            if announcer is not None:
                announcer.stop()
            if supervisor is not None:
                supervisor.stop_all()  # the processes, then the services it watches
            else:
                for service in reversed(started_services):
                    service.stop()
            self.stdout.write("stopped.")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
            return response.status in (200, 503)
    except urllib.error.HTTPError as exc:
        return exc.code in (200, 503)
    except OSError:
        return False


def _engine_ready() -> bool:
    try:
        stats = EngineClient.from_settings().stats(timeout_s=1.0)
    except (EngineUnavailable, EngineRequestError, OSError):
        return False
    return EngineState.of(stats) == EngineState.READY
