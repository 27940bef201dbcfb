"""appliance/env.py: strict, typed reading of the environment."""

from __future__ import annotations

import pytest

from appliance.env import EnvError, env_bool, env_choice, env_cpus, env_float, env_int, env_list, env_str

NAME = "APPLIANCE_TEST_ENV_VALUE"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.delenv(f"{NAME}_FILE", raising=False)


# env_bool


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "True", "yes", "on", " on "])
def test_env_bool_true_words(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    assert env_bool(NAME, default=False) is True


@pytest.mark.parametrize("raw", ["0", "false", "FALSE", "no", "off", " Off "])
def test_env_bool_false_words(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    assert env_bool(NAME, default=True) is False


@pytest.mark.parametrize("raw", ["yes-please", "2", "enabled", "t"])
def test_env_bool_rejects_other_words(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(EnvError) as excinfo:
        env_bool(NAME, default=False)
    assert NAME in str(excinfo.value)
    assert raw in str(excinfo.value)


def test_env_bool_unset_gives_default():
    assert env_bool(NAME, default=True) is True
    assert env_bool(NAME, default=False) is False


def test_env_bool_empty_string_gives_default(monkeypatch):
    monkeypatch.setenv(NAME, "")
    assert env_bool(NAME, default=True) is True


# env_int


def test_env_int_reads_number(monkeypatch):
    monkeypatch.setenv(NAME, " 42 ")
    assert env_int(NAME, 7) == 42


def test_env_int_unset_and_empty_give_default(monkeypatch):
    assert env_int(NAME, 7) == 7
    monkeypatch.setenv(NAME, "")
    assert env_int(NAME, 7) == 7


@pytest.mark.parametrize("raw", ["abc", "4.5", "1e3", "12 apples"])
def test_env_int_rejects_non_numbers(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(EnvError, match="not a whole number"):
        env_int(NAME, 7)


def test_env_int_bounds_are_inclusive(monkeypatch):
    monkeypatch.setenv(NAME, "1")
    assert env_int(NAME, 5, minimum=1, maximum=10) == 1
    monkeypatch.setenv(NAME, "10")
    assert env_int(NAME, 5, minimum=1, maximum=10) == 10


def test_env_int_below_minimum(monkeypatch):
    monkeypatch.setenv(NAME, "0")
    with pytest.raises(EnvError, match="below the minimum of 1"):
        env_int(NAME, 5, minimum=1, maximum=10)


def test_env_int_above_maximum(monkeypatch):
    monkeypatch.setenv(NAME, "11")
    with pytest.raises(EnvError, match="above the maximum of 10"):
        env_int(NAME, 5, minimum=1, maximum=10)


def test_env_int_negative_number_accepted_without_bounds(monkeypatch):
    monkeypatch.setenv(NAME, "-3")
    assert env_int(NAME, 5) == -3


# env_float


def test_env_float_reads_and_bounds(monkeypatch):
    monkeypatch.setenv(NAME, "0.25")
    assert env_float(NAME, 1.0, minimum=0.0, maximum=1.0) == 0.25
    monkeypatch.setenv(NAME, "1.5")
    with pytest.raises(EnvError, match="above the maximum"):
        env_float(NAME, 1.0, minimum=0.0, maximum=1.0)
    monkeypatch.setenv(NAME, "lots")
    with pytest.raises(EnvError, match="not a number"):
        env_float(NAME, 1.0)


# env_str


def test_env_str_reads_value(monkeypatch):
    monkeypatch.setenv(NAME, "hello")
    assert env_str(NAME, "default") == "hello"


def test_env_str_unset_gives_default():
    assert env_str(NAME, "default") == "default"
    assert env_str(NAME) is None


def test_env_str_empty_string_gives_default(monkeypatch):
    monkeypatch.setenv(NAME, "")
    assert env_str(NAME, "default") == "default"


def test_env_str_reads_name_file(monkeypatch, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-from-file\n", encoding="utf-8")
    monkeypatch.setenv(f"{NAME}_FILE", str(secret))
    # The trailing newline an editor leaves is stripped.
    assert env_str(NAME, "default") == "s3cr3t-from-file"


def test_env_str_name_file_feeds_typed_readers(monkeypatch, tmp_path):
    path = tmp_path / "number"
    path.write_text("12\n", encoding="utf-8")
    monkeypatch.setenv(f"{NAME}_FILE", str(path))
    assert env_int(NAME, 3, maximum=20) == 12


def test_env_str_refuses_both_name_and_name_file(monkeypatch, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-file", encoding="utf-8")
    monkeypatch.setenv(NAME, "from-env")
    monkeypatch.setenv(f"{NAME}_FILE", str(secret))
    with pytest.raises(EnvError, match="not both"):
        env_str(NAME, "default")


def test_env_str_unreadable_file_is_env_error(monkeypatch, tmp_path):
    monkeypatch.setenv(f"{NAME}_FILE", str(tmp_path / "does-not-exist"))
    with pytest.raises(EnvError, match="cannot be read"):
        env_str(NAME, "default")


# env_choice


def test_env_choice_accepts_listed_value(monkeypatch):
    monkeypatch.setenv(NAME, "gpu")
    assert env_choice(NAME, "cpu", ("cpu", "gpu")) == "gpu"


def test_env_choice_unset_and_empty_give_default(monkeypatch):
    assert env_choice(NAME, "cpu", ("cpu", "gpu")) == "cpu"
    monkeypatch.setenv(NAME, "")
    assert env_choice(NAME, "cpu", ("cpu", "gpu")) == "cpu"


def test_env_choice_rejects_unlisted_value(monkeypatch):
    monkeypatch.setenv(NAME, "tpu")
    with pytest.raises(EnvError) as excinfo:
        env_choice(NAME, "cpu", ("cpu", "gpu"))
    message = str(excinfo.value)
    assert "'tpu'" in message
    assert "cpu, gpu" in message


def test_env_choice_is_case_sensitive(monkeypatch):
    monkeypatch.setenv(NAME, "GPU")
    with pytest.raises(EnvError):
        env_choice(NAME, "cpu", ("cpu", "gpu"))


# env_list


def test_env_list_splits_on_commas_and_strips(monkeypatch):
    monkeypatch.setenv(NAME, " a.example , b.example,,c.example ,")
    assert env_list(NAME, ["default"]) == ["a.example", "b.example", "c.example"]


def test_env_list_single_item(monkeypatch):
    monkeypatch.setenv(NAME, "localhost")
    assert env_list(NAME, []) == ["localhost"]


def test_env_list_unset_gives_copy_of_default():
    default = ["x", "y"]
    result = env_list(NAME, default)
    assert result == ["x", "y"]
    result.append("z")
    assert default == ["x", "y"]  # the caller's default is not shared


def test_env_list_empty_string_gives_default(monkeypatch):
    monkeypatch.setenv(NAME, "")
    assert env_list(NAME, ["x"]) == ["x"]


def test_env_list_only_commas_gives_empty_list(monkeypatch):
    monkeypatch.setenv(NAME, " , ,")
    assert env_list(NAME, ["x"]) == []


@pytest.mark.parametrize(("raw", "kept"), [("", "auto"), ("AUTO", "auto"), ("off", "off"), (" 2-3,6 ", "2-3,6")])
def test_env_cpus_takes_auto_off_or_a_cpu_list(monkeypatch, raw, kept):
    monkeypatch.setenv(NAME, raw)
    assert env_cpus(NAME, "auto") == kept


@pytest.mark.parametrize("raw", ["all", "1;2", "3-", "a-b", "1,,2"])
def test_env_cpus_refuses_anything_else_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(EnvError, match=f"{NAME}=.* must be auto, off or a list of CPU numbers"):
        env_cpus(NAME, "auto")
