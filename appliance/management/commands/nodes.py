"""``manage.py nodes``: the cluster's nodes as they last announced themselves (``--forget NAME``
takes one out of the list for good, e.g. a machine retired)."""

from django.core.management.base import BaseCommand, CommandError

from appliance.cluster import forget, nodes


class Command(BaseCommand):
    help = "List the cluster's nodes (up or down), or forget one."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--forget", metavar="NAME", help="remove a node's last report from the list")

    def handle(self, *args, **options) -> None:
        if options["forget"]:
            if not forget(options["forget"]):
                raise CommandError(f"no node named {options['forget']!r} has announced itself")
            self.stdout.write(f"forgot {options['forget']}")
            return
        listed = nodes()
        if not listed:
            self.stdout.write("no node has announced itself (manage.py serve announces its node)")
        for node in listed:
            engine = node["engine"]
            state = "up" if node["up"] else "DOWN"
            self.stdout.write(
                f"{node['name']}: {state}, roles {','.join(node['roles'])}, engine {node['engine_url'] or '-'} "
                f"({engine.get('state') or '-'}, {engine.get('model') or '-'}, KV {engine.get('kv_usage')}, "
                f"running {engine.get('running')}, waiting {engine.get('waiting')}), last report {node['age_s']} s ago"
                + (f": {node['detail']}" if node.get("detail") else "")
            )
