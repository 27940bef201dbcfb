"""The API's literal types are written out for the type checker; they must stay the values the
code accepts (a value added to one place and not the other would be refused, or let through)."""

from typing import get_args

from api.endpoints import Dtype, KvDtype
from documents.api import DocumentKind, DocumentState
from documents.models import Document
from inference import api as jobs_api
from inference.capacity import DTYPE_BYTES
from inference.clauses import TAXONOMIES
from inference.models import Job, JobKind, Queue
from inference.prompts import DRAFT_LENGTHS, DRAFT_TONES, SUMMARY_LENGTHS


def test_precision_literals_are_the_precisions_the_capacity_model_knows():
    assert get_args(Dtype) == tuple(DTYPE_BYTES)
    assert get_args(KvDtype) == ("auto", *DTYPE_BYTES)


def test_document_literals_are_the_models_choices():
    assert get_args(DocumentState) == tuple(Document.State.values)
    assert get_args(DocumentKind) == tuple(Document.Kind.values)


def test_job_literals_are_the_values_the_jobs_take():
    assert get_args(jobs_api.SummaryLength) == tuple(SUMMARY_LENGTHS)
    assert get_args(jobs_api.DraftLength) == tuple(DRAFT_LENGTHS)
    assert get_args(jobs_api.Tone) == tuple(DRAFT_TONES)
    assert get_args(jobs_api.Taxonomy) == tuple(TAXONOMIES)
    assert get_args(jobs_api.JobState) == tuple(Job.State.values)
    assert get_args(jobs_api.Kind) == tuple(JobKind.values)
    assert get_args(jobs_api.QueueName) == tuple(Queue.values)
