"""The helpers the deploy tests rely on find what they claim to find."""

from tests.deploy.manifests import appliance_variables, unknown_variables


def test_the_settings_found_in_the_source_include_those_of_every_kind():
    found = appliance_variables()
    # env_str, env_int, env_bool, env_list, env_float and env_choice, in settings and elsewhere.
    assert {"DATABASE_URL", "APPLIANCE_PORT", "APPLIANCE_TLS", "APPLIANCE_ALLOWED_HOSTS", "APPLIANCE_NODE_HEARTBEAT_S",
            "APPLIANCE_DTYPE", "APPLIANCE_ROLES", "APPLIANCE_ADMIN_PASSWORD", "APPLIANCE_WEB_HOST"} <= found  # fmt: skip


def test_a_variable_the_appliance_does_not_read_is_unknown():
    assert unknown_variables(["DATABASE_URL_FILE", "HF_HUB_OFFLINE", "APPLIANCE_PORT"]) == []
    assert unknown_variables(["APPLIANCE_WORKERS", "POSTGRES_URL", "APPLIANCE_PORT_FILE_X"]) == [
        "APPLIANCE_PORT_FILE_X",
        "APPLIANCE_WORKERS",
        "POSTGRES_URL",
    ]
