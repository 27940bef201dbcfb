"""A finished job as a file to take away: Markdown for every kind, Word (.docx) for drafted
replies and summaries. Built from what the job stored, so the file says what the page said:
a draft as its author last edited it, with its numbered sources; a summary with the page of
each statement; clauses with their verified quotes."""

from __future__ import annotations

import io
from dataclasses import dataclass

from inference.job_results import DraftResult, SummaryResult
from inference.models import Job, JobKind

DOCX_CONTENT_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
DOCX_KINDS = (JobKind.DRAFT, JobKind.SUMMARISE)


@dataclass(frozen=True)
class Export:
    title: str
    body: str  # the text, as Markdown
    sources: list[str]  # "[1] Lease, p. 3", "Supported by p. 2", ...
    sources_heading: str


UNREADABLE = "a document you may no longer read"


def export_of(job: Job, readable: set[int] | None = None) -> Export:
    """``readable``: the ids of the documents the person exporting may read now; a draft's
    passages from any other are left out, as on the page."""
    document = job.document.title if job.document is not None else ""
    if job.kind == JobKind.DRAFT:
        draft = DraftResult.from_json(job.result_data or {})
        sources = [
            f"[{p.number}] {p.source}: {p.text}"
            if readable is None or p.document_id in readable
            else f"[{p.number}] {UNREADABLE}"
            for p in draft.passages
        ]
        return Export("Drafted reply", draft.edited_text or job.result_text, sources, "Sources")
    if job.kind == JobKind.SUMMARISE:
        sources = [
            f"{s.text} ({'p. ' + str(s.page) if s.page else 'no page of the document says this'})"
            for s in SummaryResult.from_json(job.result_data or {}).statements or ()
        ]
        return Export(f"Summary of {document}", job.result_text, sources, "Where each statement comes from")
    if job.kind == JobKind.EXTRACT_CLAUSES:
        return Export(f"Clauses of {document}", job.result_text, [], "")
    return Export(job.get_kind_display(), job.result_text, [], "")


def as_markdown(job: Job, readable: set[int] | None = None) -> str:
    export = export_of(job, readable)
    lines = [f"# {export.title}", "", _meta(job), "", export.body.strip(), ""]
    edited = job.kind == JobKind.DRAFT and DraftResult.from_json(job.result_data or {}).edited_text
    if job.result_note and not edited:  # the note is about the model's draft
        lines += [f"_{job.result_note}_", ""]
    if export.sources:
        lines += [f"## {export.sources_heading}", ""] + [f"- {source}" for source in export.sources] + [""]
    return "\n".join(lines)


def as_docx(job: Job, readable: set[int] | None = None) -> bytes:
    from docx import Document as WordDocument

    export = export_of(job, readable)
    word = WordDocument()
    word.core_properties.title = export.title
    word.add_heading(export.title, level=1)
    word.add_paragraph().add_run(_meta(job)).italic = True
    for paragraph in export.body.strip().split("\n\n"):
        word.add_paragraph(paragraph.strip())
    if export.sources:
        word.add_heading(export.sources_heading, level=2)
        for source in export.sources:
            word.add_paragraph(source, style="List Bullet")
    buffer = io.BytesIO()
    word.save(buffer)
    return buffer.getvalue()


def _meta(job: Job) -> str:
    model = getattr(getattr(job, "metrics", None), "model", "") or "the appliance's model"
    finished = job.finished_at.strftime("%Y-%m-%d %H:%M UTC") if job.finished_at else ""
    return f"Written by {model}, {finished}. Check it before you rely on it."
