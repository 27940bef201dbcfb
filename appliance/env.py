"""Strict, typed reading of the environment (after Healthchecks' ``envbool``).

Every setting the appliance reads from the environment goes through these functions, so that
``DEBUG=yes-please`` is an error at start-up rather than a silent ``False``, and so that secrets
can come from files (``FOO_FILE=/run/secrets/foo``) instead of the process environment.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class EnvError(ValueError):
    """An environment variable is set to something the appliance cannot use."""


def env_str(name: str, default: str | None = None) -> str | None:
    """The value of ``name``, or of the file named by ``name_FILE``, or ``default``.

    Setting both is refused: it is never clear which one the operator meant.
    """
    value = os.environ.get(name)
    file_name = os.environ.get(f"{name}_FILE")
    if value is not None and file_name is not None:
        raise EnvError(f"set {name} or {name}_FILE, not both")
    if file_name is not None:
        try:
            return Path(file_name).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise EnvError(f"{name}_FILE={file_name!r} cannot be read: {exc.strerror}") from exc
    if value is None or value == "":
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = env_str(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean; use one of {sorted(_TRUE | _FALSE)}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = env_str(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a whole number") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={value} is below the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise EnvError(f"{name}={value} is above the maximum of {maximum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    raw = env_str(name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={value} is below the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise EnvError(f"{name}={value} is above the maximum of {maximum}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env_str(name)
    if raw is None:
        return default
    if raw not in choices:
        raise EnvError(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


def env_cpus(name: str, default: str) -> str:
    """``auto``, ``off`` or a list of CPU numbers (``3``, ``2-3,6``), checked here, not when
    the processes start."""
    raw = (env_str(name) or default).strip()
    if raw.lower() in ("auto", "off"):
        return raw.lower()
    if not all(re.fullmatch(r"\d+(-\d+)?", part.strip()) for part in raw.split(",")):
        raise EnvError(f"{name}={raw!r} must be auto, off or a list of CPU numbers such as 3 or 2-3,6")
    return raw


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env_str(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]
