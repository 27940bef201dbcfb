"""The API's literal types are written out for the type checker; they must stay the values the
code accepts (a value added to one place and not the other would be refused, or let through)."""

from typing import get_args

from api.endpoints import Dtype, KvDtype
from documents.api import DocumentKind, DocumentState
from documents.models import Document
from inference.capacity import DTYPE_BYTES


def test_precision_literals_are_the_precisions_the_capacity_model_knows():
    assert get_args(Dtype) == tuple(DTYPE_BYTES)
    assert get_args(KvDtype) == ("auto", *DTYPE_BYTES)


def test_document_literals_are_the_models_choices():
    assert get_args(DocumentState) == tuple(Document.State.values)
    assert get_args(DocumentKind) == tuple(Document.Kind.values)
