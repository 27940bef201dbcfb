"""The one model this appliance serves, as ``/v1/models`` lists it."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from api.problems import ApiProblem

OWNED_BY = "appliance"


def served_model_id() -> str:
    """The id clients name the model by: the model directory's name, as the engine host reports
    it (``stats()["model"]``) and the job metrics record it."""
    return Path(settings.APPLIANCE_MODEL).name


def served_model() -> dict:
    path = Path(settings.APPLIANCE_MODEL)
    try:
        created = int(path.stat().st_mtime)  # when the model was installed on this appliance
    except OSError:  # a web node without the model's files (the engine runs elsewhere)
        created = 0
    return {"id": served_model_id(), "object": "model", "created": created, "owned_by": OWNED_BY}


def model_or_404(model: str) -> dict:
    served = served_model()
    if model != served["id"]:
        raise ApiProblem(
            404,
            "not-found",
            f"The model {model!r} does not exist on this appliance; it serves {served['id']!r} (see GET /v1/models).",
        )
    return served
