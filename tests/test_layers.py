"""The import layers the design names (docs/architecture.md, *Layers*), held by a test:

- the pure modules import no Django, no Celery, no vLLM, no database or broker client, and of
  the project only other pure modules: they are the decisions, testable without services;
- only the engine host's modules import vLLM;
- the web process never imports vLLM (it serves the staff UI, the API and ``/v1`` without it);
- the product never imports the ``measure`` app (benchmarks, spec sheet run, evaluation): it
  drives the product, not the other way round.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("appliance", "documents", "inference", "console", "api", "measure", "directory")
PRODUCT = ("appliance", "documents", "inference", "console", "api", "directory")

PURE = {
    "appliance.rendering",
    "appliance.sizing",
    "directory.mapping",
    "documents.archives",
    "documents.batch_progress",
    "documents.chunking",
    "documents.embedding_batcher",
    "documents.extraction",
    "documents.extraction.base",
    "documents.extraction.detect",
    "documents.extraction.docx",
    "documents.extraction.mail",
    "documents.extraction.pdf",
    "documents.extraction.text",
    "documents.ocr",
    "documents.rerank",
    "documents.source_changes",
    "inference.clauses",
    "inference.drafting",
    "inference.engine.protocol",
    "inference.engine.step_policy",
    "measure.evaluation.gold",
    "measure.evaluation.longdoc",
    "measure.evaluation.metrics",
    "measure.evaluation.retrieval",
    "inference.facts",
    "inference.job_options",
    "inference.job_results",
    "inference.fairshare",
    "inference.placement",
    "inference.capacity",
    "measure.intervals",
    "inference.specsheet",
    "inference.prompts",
    "inference.quotes",
    "inference.sampling",
    "inference.sourcing",
    "inference.summarise",
    "inference.timing",
}
NOT_IN_PURE = ("django", "celery", "kombu", "vllm", "torch", "transformers", "psycopg", "psycopg_pool", "redis")
VLLM_IMPORTERS = {"inference.engine.host", "inference.engine.vllm_scheduler", "inference.engine.vllm_cli"}


def product_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def imports_of(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (absolute names)."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".", 1)[0]


def test_imports_are_read_with_relative_ones_made_absolute(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("import os\nfrom . import sibling\nfrom ..other import thing\ndef f():\n    import vllm\n")
    assert imports_of(path, "pkg.sub.mod") == {
        "os",
        "pkg.sub",
        "pkg.sub.sibling",
        "pkg.other",
        "pkg.other.thing",
        "vllm",
    }


def test_every_pure_module_exists():
    assert set(product_modules()) >= PURE, sorted(PURE - set(product_modules()))


@pytest.mark.parametrize("module", sorted(PURE))
def test_a_pure_module_imports_no_framework_and_only_pure_project_modules(module):
    modules = product_modules()
    found = imports_of(modules[module], module)
    frameworks = sorted(name for name in found if top(name) in NOT_IN_PURE)
    impure = sorted(
        name for name in found if top(name) in PACKAGES and name in modules and name not in PURE and name != top(name)
    )
    assert not frameworks, f"{module} is pure but imports {frameworks}"
    assert not impure, f"{module} is pure but imports project modules that are not: {impure}"


def test_only_the_engine_host_imports_vllm():
    importers = {
        module
        for module, path in product_modules().items()
        if any(top(name) == "vllm" for name in imports_of(path, module))
    }
    assert importers <= VLLM_IMPORTERS, sorted(importers - VLLM_IMPORTERS)
    assert "inference.engine.host" in importers  # the rule is about something: the host does import it


def test_the_product_never_imports_measurement():
    offenders = {
        module: sorted(name for name in imports_of(path, module) if top(name) == "measure")
        for module, path in product_modules().items()
        if top(module) in PRODUCT
    }
    offenders = {module: names for module, names in offenders.items() if names}
    assert not offenders, offenders
    # The rule is about something: measurement does import the product.
    assert any(top(name) == "inference" for name in imports_of(product_modules()["measure.bench_scheduling"], "x.y"))


def test_the_web_process_never_imports_vllm():
    # What uvicorn loads (appliance.asgi), then every view the URLs name, and the API with /v1.
    script = (
        "import sys, django\n"
        "from appliance.asgi import application\n"
        "from django.urls import get_resolver\n"
        "def walk(patterns):\n"
        "    for p in patterns:\n"
        "        walk(getattr(p, 'url_patterns', []))\n"
        "walk(get_resolver().url_patterns)\n"
        "import api.site, inference.openai_api, inference.views, documents.views, console.views\n"
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.') or m == 'inference.engine.host'))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "appliance.settings_test", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
