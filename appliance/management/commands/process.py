"""``manage.py process NAME``: one process of the appliance, as the one declaration says
(``appliance.supervisor.appliance_processes``), for the managers in deploy/ that run each process
on its own: a systemd unit, a Compose service, a container of a Kubernetes pod. They name the
process, never its command line, so that they and ``manage.py serve`` cannot drift apart.

NAME is a role's process, with the engine slot for those that have one (``APPLIANCE_ENGINES`` on
the node; 0 when left out):

- ``web``, ``beat`` (the web role's periodic tasks; exits at once when none is configured),
  ``ingest``;
- ``engine-N``: the engine host of slot N (its GPUs, socket and TCP port, ``engine_slots``);
- ``prefill-N``, ``decode-N``: the workers of the engine of slot N.

It does the role's preparation first (``appliance.node_preparation``: the web role migrates, the
engine prepares the model), then replaces itself with the process (exec), so that the manager's
signals reach it directly: SIGTERM is the process's own graceful stop. ``--print`` prints the
command line and the environment it adds instead.
"""

from __future__ import annotations

import os
import re
import shlex
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from appliance.env import env_int
from appliance.node_preparation import prepare_node, require_external_services
from appliance.supervisor import ROLES, ProcessSpec, RolesError, appliance_processes

# NAME -> the role, and the engine slot for the roles that have one.
_NAME = re.compile(r"^(?P<role>web|beat|ingest|engine|prefill|decode)(?:-(?P<slot>\d+))?$")
_PER_ENGINE = ("engine", "prefill", "decode")
# The declaration's name for each role's process in slot 0 (the next slots add "-N").
_DECLARED = {"web": "web", "beat": "beat", "ingest": "ingest-worker", "engine": "engine",
             "prefill": "prefill-worker", "decode": "decode-worker"}  # fmt: skip


class NoSuchProcess(ValueError):
    """A NAME that names no process of the declaration (or, for ``beat``, none configured)."""


def declared_process(name: str, *, settings, python: str, port: int) -> ProcessSpec:
    """The process the declaration has for ``name`` (the module's docstring), with this node's
    settings: pool caps, the engine slot's GPUs, socket and port."""
    match = _NAME.match(name.strip().lower())
    if not match:
        raise NoSuchProcess(
            f"no process {name!r}: web, beat, ingest, engine-N, prefill-N or decode-N (N: the engine slot)"
        )
    role, slot = match["role"], int(match["slot"] or 0)
    if match["slot"] is not None and role not in _PER_ENGINE:
        raise NoSuchProcess(f"{role} has no engine slot: name it {role!r}")
    engines = getattr(settings, "APPLIANCE_ENGINES", 1)
    if slot >= engines:
        raise NoSuchProcess(f"{name}: engine slot {slot}, but APPLIANCE_ENGINES={engines} (slots 0 to {engines - 1})")
    wanted = _DECLARED[role] + (f"-{slot}" if slot else "")
    try:
        specs = appliance_processes(python=python, port=port, settings=settings, roles=ROLES)
    except RolesError as exc:  # APPLIANCE_ENGINE_GPUS too short for the engines it is asked for
        raise NoSuchProcess(str(exc)) from exc
    for spec in specs:
        if spec.name == wanted:
            return spec
    if role == "beat":
        raise NoSuchProcess(
            "beat: no periodic task is configured (sources turned off with APPLIANCE_SOURCE_TICK_S=0, and no LDAP "
            "or OIDC sign-in with a sync interval)"
        )
    raise NoSuchProcess(f"{name}: the declaration has no process {wanted!r}")  # pragma: no cover


class Command(BaseCommand):
    help = (
        "Run one process of the appliance as declared (web, beat, ingest, engine-N, prefill-N, decode-N): "
        "what deploy/'s systemd units, Compose services and Kubernetes containers run."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="web, beat, ingest, engine-N, prefill-N or decode-N (N: engine slot, 0)")
        parser.add_argument("--port", type=int, default=env_int("APPLIANCE_PORT", 8000, minimum=1, maximum=65535))
        parser.add_argument("--print", action="store_true", help="print the command line; start nothing")

    def handle(self, *args, name: str, port: int, print: bool = False, **options) -> None:  # noqa: A002
        try:
            spec = declared_process(name, settings=settings, python=sys.executable, port=port)
        except NoSuchProcess as exc:
            if name.strip().lower() == "beat" and not print:
                # The beat unit (or container) is there on every web node; without a schedule it has
                # nothing to do, and says so rather than fail.
                self.stdout.write(f"{exc}: nothing to run")
                return
            raise CommandError(str(exc)) from exc
        if print:
            added = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(spec.env.items()))
            self.stdout.write((added + " " if added else "") + shlex.join(spec.argv))
            return
        require_external_services(f"manage.py process {name}")
        role = spec.role if spec.name != "beat" else "beat"
        prepare_node([role] if role in ROLES else [], write=self.stdout.write)
        self.stdout.write(f"starting {spec.name}: {shlex.join(spec.argv)}")
        self.stdout.flush()
        sys.stderr.flush()
        os.chdir(settings.BASE_DIR)
        os.execvpe(spec.argv[0], spec.argv, {**os.environ, **spec.env})  # noqa: S606 - the declared command
