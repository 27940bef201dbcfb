"""documents/confinement.py: what code running in the parsing child can reach (an attack probe).

A parser bug that runs code is simulated by running the probe as the child would be: a fresh
interpreter that confines itself exactly as ``documents.sandbox`` does, then tries what such code
would try. Run against the real kernel, the real embedded Valkey and Postgres of the test suite,
and the real ``var/`` directory of the suite.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from documents.sandbox import extract_in_sandbox, last_confinement

BASE_DIR = Path(__file__).resolve().parent.parent.parent

PROBE = r"""
import json, os, socket, subprocess, sys, tempfile
from documents.confinement import confine

root, temp_dir, secret, ports = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
confinement = confine(import_root=root, temp_dir=temp_dir).to_dict()
tried = {}

def attempt(name, action):
    try:
        action()
        tried[name] = "allowed"
    except OSError as exc:
        tried[name] = f"refused: {exc.strerror or exc}"

attempt("read_secret_key", lambda: open(secret).read())
attempt("read_var_dir", lambda: os.listdir(os.path.dirname(os.path.dirname(secret))))
attempt("read_project_file", lambda: open(os.path.join(root, "README.md")).read())
attempt("list_project_dir", lambda: os.listdir(root))
attempt("read_etc_passwd", lambda: open("/etc/passwd").read())
attempt("write_outside_temp", lambda: open(os.path.join(root, "probe-was-here"), "w").write("x"))
for name, port in ports.items():
    attempt(f"tcp_{name}", lambda port=port: socket.create_connection(("127.0.0.1", port), timeout=2).close())
def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", ("127.0.0.1", 53))
attempt("udp_loopback", udp)
attempt("write_temp", lambda: open(os.path.join(temp_dir, "ok"), "w").write("ok"))
def big_file():
    with open(os.path.join(temp_dir, "big"), "wb") as f:
        f.seek(confinement["limits"]["RLIMIT_FSIZE"])
        f.write(b"x")
attempt("write_past_file_size_limit", big_file)
def many_files():
    handles = [open(os.devnull) for _ in range(confinement["limits"]["RLIMIT_NOFILE"] + 1)]
attempt("open_past_file_limit", many_files)
def pypdf_import():
    import pypdf  # noqa: F401
attempt("import_pypdf", pypdf_import)
def ocr_program():
    subprocess.run(["tesseract", "--version"], check=True, capture_output=True)
attempt("run_tesseract", ocr_program)
print(json.dumps({"confinement": confinement, "tried": tried}))
"""


def _landlock_abi() -> int:
    return ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)


@pytest.fixture(scope="module")
def probe():
    temp_dir = tempfile.mkdtemp(prefix="confinement-probe-")
    secret = Path(settings.VAR_DIR) / "secrets" / "valkey"
    assert secret.exists()  # the suite's embedded broker's password
    ports = {"valkey": settings.EMBEDDED_REDIS_PORT, "postgres": settings.EMBEDDED_PG_PORT}
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(BASE_DIR)}
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, str(BASE_DIR), temp_dir, str(secret), json.dumps(ports)],
        capture_output=True,
        text=True,
        env=env,
        cwd=temp_dir,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    yield json.loads(completed.stdout.strip().splitlines()[-1])
    subprocess.run(["rm", "-rf", temp_dir], check=False)


def test_code_in_the_child_cannot_read_the_appliances_secrets_or_files(probe):
    tried = probe["tried"]
    assert _landlock_abi() >= 1, "this kernel has no Landlock: the file system layer cannot hold here"
    assert probe["confinement"]["landlock_abi"] >= 1
    assert tried["read_secret_key"].startswith("refused")
    assert tried["read_var_dir"].startswith("refused")
    assert tried["read_project_file"].startswith("refused")
    assert tried["list_project_dir"].startswith("refused")
    assert tried["read_etc_passwd"].startswith("refused")
    assert tried["write_outside_temp"].startswith("refused")
    assert not (BASE_DIR / "probe-was-here").exists()
    # What parsing needs still works.
    assert tried["write_temp"] == "allowed"
    assert tried["import_pypdf"] == "allowed"
    assert tried["run_tesseract"] == "allowed"


def test_code_in_the_child_reaches_no_network_not_even_the_appliances_own_services(probe):
    tried = probe["tried"]
    assert probe["confinement"]["network_namespace"] or probe["confinement"]["landlock_network"]
    assert tried["tcp_valkey"].startswith("refused")
    assert tried["tcp_postgres"].startswith("refused")
    if probe["confinement"]["network_namespace"]:
        assert tried["udp_loopback"].startswith("refused")  # no interface is up at all


def test_code_in_the_child_is_held_to_file_and_descriptor_limits(probe):
    limits = probe["confinement"]["limits"]
    assert limits["RLIMIT_NOFILE"] == 256 and limits["RLIMIT_CORE"] == 0
    assert probe["tried"]["write_past_file_size_limit"].startswith("refused")
    assert probe["tried"]["open_past_file_limit"].startswith("refused")
    if os.getuid() != 0:
        assert probe["confinement"]["processes_limited"]
    else:  # the kernel exempts root from the process limit; the child says so
        assert any("root" in problem for problem in probe["confinement"]["problems"])


def test_a_grant_that_would_cover_a_protected_directory_is_left_out(tmp_path):
    probe = (
        "import json, sys; from documents.confinement import confine; "
        "c = confine(import_root=sys.argv[1], temp_dir=sys.argv[2], extra_read_paths=(sys.argv[3],), "
        "protected=(sys.argv[4],)); "
        "import os\ntry:\n    open(sys.argv[5]).read(); seen = True\nexcept OSError:\n    seen = False\n"
        "print(json.dumps({'problems': c.problems, 'seen': seen}))"
    )
    var = tmp_path / "opt" / "var"
    var.mkdir(parents=True)
    (var / "secret").write_text("s")
    temp_dir = tempfile.mkdtemp(prefix="confinement-probe-")
    completed = subprocess.run(
        [sys.executable, "-c", probe, str(BASE_DIR), temp_dir, str(tmp_path / "opt"), str(var), str(var / "secret")],
        capture_output=True, text=True, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(BASE_DIR)},
        cwd=temp_dir, timeout=120, check=True,
    )  # fmt: skip
    out = json.loads(completed.stdout.strip().splitlines()[-1])
    assert out["seen"] is False  # /opt was asked for, but it holds var/: left out
    assert any("must stay out of reach" in p for p in out["problems"])


def test_the_real_sandbox_child_is_confined_and_says_so():
    document = extract_in_sandbox(b"A plain text file.\n", filename="note.txt")
    assert "plain text" in document.pages[0].text
    reported = last_confinement()
    assert reported is not None
    assert reported["landlock_abi"] == _landlock_abi()
    assert reported["network_namespace"] or reported["landlock_network"]
