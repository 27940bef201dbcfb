"""How each kind of job talks to the engine host, inside a worker.

A runner takes a claimed job and returns a ``TaskResult``: the text, a note, structured data and
every engine request it made (for the metrics). ``services.job_run`` claims the job, calls the
runner of its kind, and stores what it returns. Runners stream what the user should watch
(``visible`` requests) to the job's Redis stream; the others (a long document's sections, JSON)
report progress instead.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.utils import timezone

from inference import grounding, streaming
from inference.clauses import clause_schema, parse_answer, quote_choices, verify_clauses
from inference.drafting import DRAFT_MAX_TOKENS, check_support, support_summary
from inference.engine.client import EngineClient
from inference.engine.protocol import GenerateRequest, Priority
from inference.models import Job, JobKind, Queue
from inference.prompts import (
    DEFAULT_SUMMARY_LENGTH,
    PageText,
    clause_instruction,
    combine_messages,
    draft_messages,
    section_messages,
    summary_instruction,
)
from inference.sourcing import SourcePassage, source_statements
from inference.summarise import Section, group_partials, split_sections
from inference.timing import Delta

logger = logging.getLogger(__name__)

PRIORITY_FOR_QUEUE = {Queue.PREFILL: Priority.PREFILL, Queue.DECODE: Priority.DECODE}
PUBLISH_INTERVAL_S = 0.1  # token batches to the browser; also how soon a cancel is seen
HIDDEN_CANCEL_CHECK_S = 0.5  # how soon a cancel is seen while a hidden request writes
PARTIAL_SUMMARY_MAX_TOKENS = 320
CLAUSES_MAX_TOKENS = 1024


@dataclass
class EngineRun:
    text: str = ""
    deltas: list[Delta] = field(default_factory=list)
    admitted: dict = field(default_factory=dict)
    done: dict = field(default_factory=dict)
    cancelled: bool = False


@dataclass
class TaskResult:
    text: str = ""
    note: str = ""
    data: dict = field(default_factory=dict)
    runs: list[EngineRun] = field(default_factory=list)  # every engine request, in order
    visible: EngineRun | None = None  # the one the user watched stream, if any

    @property
    def cancelled(self) -> bool:
        return any(run.cancelled for run in self.runs)

    def run_hidden(self, job: Job, client: EngineClient, request: GenerateRequest) -> EngineRun:
        """One request whose tokens the user does not watch; kept with the others."""
        run = run_engine(job, request, client, visible=False)
        self.runs.append(run)
        return run


def engine_request(
    job: Job, messages: list[dict[str, str]], max_tokens: int, *, part: str, json_schema: dict | None = None
) -> GenerateRequest:
    options = job.options
    free_text = json_schema is None and job.kind in (JobKind.SUMMARISE, JobKind.DRAFT)
    return GenerateRequest(
        request_id=f"{job.pk}-{job.attempts}-{part}",
        messages=messages,
        max_tokens=max_tokens,
        priority=PRIORITY_FOR_QUEUE[Queue(job.queue)],
        queue=job.queue,
        temperature=float(options.get("temperature", 0.0)),
        top_p=float(options.get("top_p", 1.0)),
        seed=None if options.get("seed") is None else int(options["seed"]),
        stop=[str(s) for s in options.get("stop", ())],
        frequency_penalty=float(
            options.get("frequency_penalty", settings.APPLIANCE_FREQUENCY_PENALTY if free_text else 0.0)
        ),
        ignore_eos=bool(options.get("ignore_eos", False)),
        json_schema=json_schema,
    )


def run_engine(job: Job, request: GenerateRequest, client: EngineClient, *, visible: bool = True) -> EngineRun:
    """One engine request. ``visible``: its tokens go to the job's stream (the first at once,
    later ones in batches of at most ``PUBLISH_INTERVAL_S``, one broker round trip per batch that
    also checks for a cancel: the worker shares the machine with the engine). Otherwise only
    waiting and progress events go out, and a cancel is checked twice a second."""
    run = EngineRun()
    parts: list[str] = []
    pending: list[str] = []
    pending_times: list[list[float]] = []
    last_publish = 0.0

    def flush(now: float) -> bool:
        # Each delta says how many tokens it carries, when each of them reached the worker (the
        # batch hides the gaps between them) and the prompt's length, so that a client can time
        # every token (``manage.py specsheet``, ``continuous_usage_stats``).
        nonlocal last_publish
        last_publish = now
        data = {"text": "".join(pending), "tokens": sum(int(n) for _, n in pending_times), "times": list(pending_times)}
        if run.admitted and "prompt_tokens" in run.admitted:
            data["prompt_tokens"] = run.admitted["prompt_tokens"]
        pending[:], pending_times[:] = [], []
        return streaming.publish_and_check_cancel(job.pk, "delta", data)

    events = client.generate(request, idle_timeout_s=settings.APPLIANCE_JOB_TIME_LIMIT_S)
    with _heartbeat(job.pk):
        try:
            for event in events:
                cancelled = False
                if event.type == "admitted":
                    run.admitted = event.data
                elif event.type == "waiting":  # for KV budget or its prefill turn; once a second
                    data = {"reason": event.data.get("reason"), "position": event.data.get("position")}
                    cancelled = streaming.publish_and_check_cancel(job.pk, "waiting", data)
                elif event.type == "prefill":  # reading the prompt; once a second
                    data = {
                        "prompt_tokens_done": event.data.get("tokens_done"),
                        "prompt_tokens": event.data.get("prompt_tokens"),
                    }
                    cancelled = streaming.publish_and_check_cancel(job.pk, "progress", data)
                elif event.type == "delta":
                    parts.append(event.data["text"])
                    run.deltas.append(Delta(at=event.received_at, tokens=int(event.data.get("tokens", 0))))
                    if visible:
                        pending.append(event.data["text"])
                        pending_times.append([round(event.received_at, 4), int(event.data.get("tokens", 0))])
                        if len(run.deltas) == 1 or event.received_at - last_publish >= PUBLISH_INTERVAL_S:
                            cancelled = flush(event.received_at)
                    elif event.received_at - last_publish >= HIDDEN_CANCEL_CHECK_S:
                        last_publish = event.received_at
                        cancelled = streaming.cancel_requested(job.pk)
                elif event.type == "done":
                    run.done = event.data
                    if pending:
                        cancelled = flush(event.received_at)
                if cancelled:
                    run.cancelled = True
                    break  # closing the stream makes the engine host abort the request
        finally:
            events.close()
    run.text = "".join(parts)
    return run


@contextmanager
def _heartbeat(job_id):
    """While the body runs, mark the job alive every quarter of the heartbeat timeout, from a
    thread of its own: a long prefill sends no tokens, but the worker is alive all the same."""
    from django.db import connection

    stop = threading.Event()
    interval_s = settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S / 4

    def beat() -> None:
        try:
            while not stop.wait(interval_s):
                try:
                    Job.objects.filter(pk=job_id, state=Job.State.RUNNING).update(heartbeat_at=timezone.now())
                except Exception:  # the next beat tries again; the watchdog is patient
                    logger.warning("job %s: heartbeat failed", job_id, exc_info=True)
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=f"heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _progress(job: Job, step: str) -> None:
    streaming.publish(job.pk, "progress", {"step": step})


def _document_sections(job: Job, client: EngineClient) -> tuple[list[PageText], list[Section]]:
    document = job.document
    pages = [PageText(p.number, p.text) for p in document.pages.order_by("number").only("number", "text")]
    context = int(client.stats()["max_model_len"])
    sections = split_sections(title=document.title, pages=pages, context_tokens=context, count_many=client.count_tokens)
    return pages, sections


# --- summaries -------------------------------------------------------------------------------


def run_summary(job: Job, client: EngineClient) -> TaskResult:
    """The summary (``_summarise``), then the page each of its statements comes from."""
    result = _summarise(job, client)
    if result.text and not result.cancelled:
        result.data["statements"] = summary_statements(job.document, result.text)
    return result


def summary_statements(document, text: str) -> list[dict] | None:
    """Each sentence of ``text`` with the page of ``document`` it comes from (``sourcing``), or
    None while the document's passages are embedded by another model than the one loaded."""
    from documents.embeddings import get_embedder
    from documents.models import Chunk

    embedder = get_embedder()
    chunks = Chunk.objects.filter(document=document, embedding__isnull=False)
    if chunks.exclude(embedding_model=embedder.model_name).exists():
        return None
    passages = [
        SourcePassage(page_start, page_end, vector)
        for page_start, page_end, vector in chunks.values_list("page_start", "page_end", "embedding")
    ]
    last_page = document.pages_total or max((p.page_end for p in passages), default=1)
    statements = source_statements(text, passages, last_page=last_page, embed=embedder.encode)
    return [asdict(statement) for statement in statements]


def _summarise(job: Job, client: EngineClient) -> TaskResult:
    """One request when the document fits in one section; otherwise each section is summarised
    (hidden), then the partial summaries are combined (in groups while they do not fit together),
    and the last combination streams to the user."""
    title = job.document.title
    length = job.options.get("length", DEFAULT_SUMMARY_LENGTH)
    focus = job.options.get("focus", "")
    max_tokens = int(job.options.get("max_tokens") or settings.APPLIANCE_SUMMARY_MAX_TOKENS)
    pages, sections = _document_sections(job, client)
    result = TaskResult(data={"sections": [s.page_label for s in sections]})
    if len(sections) == 1:
        messages = section_messages(
            title=title, pages=list(sections[0].pages), instruction=summary_instruction(length=length, focus=focus)
        )
        run = run_engine(job, engine_request(job, messages, max_tokens, part="summary"), client)
        result.runs.append(run)
        result.visible, result.text = run, run.text
        return result

    partials: list[tuple[str, str]] = []
    for section in sections:
        _progress(job, f"Reading {section.page_label} (part {section.index + 1} of {len(sections)})")
        instruction = summary_instruction(length=length, focus=focus, part=section.page_label)
        messages = section_messages(title=title, pages=list(section.pages), instruction=instruction)
        run = result.run_hidden(
            job, client, engine_request(job, messages, PARTIAL_SUMMARY_MAX_TOKENS, part=f"s{section.index}")
        )
        if run.cancelled:
            return result
        partials.append((section.page_label, run.text))
    result.data["partials"] = [{"pages": label, "text": text} for label, text in partials]

    context = int(client.stats()["max_model_len"])

    def fits(group: list[tuple[str, str]]) -> bool:
        messages = combine_messages(title=title, partials=group, length=length, focus=focus)
        return client.count_tokens([messages])[0] + max_tokens <= context

    round_ = 0
    groups = group_partials(partials, fits=fits)
    while len(groups) > 1:
        round_ += 1
        _progress(job, f"Combining {len(partials)} partial summaries")
        combined: list[tuple[str, str]] = []
        for index, group in enumerate(groups):
            messages = combine_messages(title=title, partials=group, length="detailed", focus=focus)
            request = engine_request(job, messages, PARTIAL_SUMMARY_MAX_TOKENS, part=f"r{round_}-{index}")
            run = result.run_hidden(job, client, request)
            if run.cancelled:
                return result
            combined.append((f"{group[0][0]} to {group[-1][0]}", run.text))
        partials = combined
        groups = group_partials(partials, fits=fits)
    messages = combine_messages(title=title, partials=groups[0], length=length, focus=focus)
    run = run_engine(job, engine_request(job, messages, max_tokens, part="final"), client)
    result.runs.append(run)
    result.visible, result.text = run, run.text
    last_page = pages[-1].number
    result.note = (
        f"The document is longer than the model's context: its {last_page} pages were read in {len(sections)} "
        "parts, each summarised, then the summaries combined."
    )
    return result


# --- clauses ---------------------------------------------------------------------------------


def run_clauses(job: Job, client: EngineClient) -> TaskResult:
    """Each section answers in JSON held to the clause schema by the engine's guided decoding;
    every quote is then looked for in the stored page text, and what is not found is dropped."""
    title = job.document.title
    categories = tuple(job.options["categories"])
    pages, sections = _document_sections(job, client)
    stored = {page.number: page.text for page in pages}
    result = TaskResult()
    raw: list[dict] = []
    cut_short = 0
    for section in sections:
        _progress(job, f"Looking for clauses in {section.page_label} (part {section.index + 1} of {len(sections)})")
        numbers = sorted({p.number for p in section.pages})
        messages = section_messages(title=title, pages=list(section.pages), instruction=clause_instruction(categories))
        request = engine_request(
            job,
            messages,
            CLAUSES_MAX_TOKENS,
            part=f"c{section.index}",
            json_schema=clause_schema(categories, numbers, quote_choices([p.text for p in section.pages])),
        )
        run = result.run_hidden(job, client, request)
        if run.cancelled:
            return result
        found, complete = parse_answer(run.text)
        if not complete:
            cut_short += 1  # the answer ran past its token limit; what it finished is kept
            logger.warning("job %s: section %s gave an incomplete answer", job.pk, section.index)
        raw.extend(found)
    verified = verify_clauses(raw, stored, categories)
    clauses = [asdict(clause) for clause in verified.clauses]
    result.data = {
        "taxonomy": job.options.get("taxonomy"),
        "categories": list(categories),
        "clauses": clauses,
        "proposed": len(raw),
        "dropped": len(verified.dropped),
        "dropped_examples": verified.dropped[:20],
        "sections": len(sections),
        "incomplete_sections": cut_short,
    }
    lines = [
        f"- **{c['category']}** (p. {c['page']}): \u201c{c['quote']}\u201d"
        + (f" \u2014 {c['note']}" if c["note"] else "")
        for c in clauses
    ]
    result.text = "\n".join(lines) if lines else "No clauses of the chosen categories were found."
    result.note = (
        f"{len(clauses)} clause(s) found, each quote checked against the page text. "
        f"{len(verified.dropped)} quote(s) the model gave could not be found in the document and were dropped."
        + (
            f" The answer for {cut_short} part(s) ran past its length limit; what it finished was checked."
            if cut_short
            else ""
        )
    )
    streaming.publish(job.pk, "snapshot", {"text": result.text})
    return result


# --- drafting --------------------------------------------------------------------------------


def run_draft(job: Job, client: EngineClient) -> TaskResult:
    """Search the owner's documents (as they may read them now) for passages that answer the
    message, number them, stream the reply, then check each of its sentences against the
    passages it cites."""
    from documents.embeddings import get_embedder

    options = job.options
    scope = grounding.Scope(document_ids=tuple(options.get("document_ids") or ()), group_id=options.get("group_id"))
    embedder = get_embedder()
    _progress(job, "Finding the passages that answer the message")
    passages = grounding.retrieve(user=job.owner, message=options["message"], scope=scope, embedder=embedder)
    shown = grounding.numbered(passages)
    max_tokens = DRAFT_MAX_TOKENS[options["length"]]
    context = int(client.stats()["max_model_len"])
    while True:  # the best passages that fit beside the message and the answer
        messages = draft_messages(
            message=options["message"], passages=shown, tone=options["tone"], length=options["length"]
        )
        prompt_tokens = client.count_tokens([messages])[0]
        if prompt_tokens + max_tokens <= context or not shown:
            break
        shown.pop()
    if prompt_tokens + max_tokens > context:
        raise ValueError(
            f"The incoming message is too long for the model: it takes {prompt_tokens} of the "
            f"{context} tokens the model reads, with {max_tokens} more needed for the reply. Shorten it."
        )
    run = run_engine(job, engine_request(job, messages, max_tokens, part="draft"), client)
    result = TaskResult(text=run.text, runs=[run], visible=run)
    if run.cancelled:
        return result
    checks = check_support(run.text, shown, embed=embedder.encode)
    support = support_summary(checks)
    result.data = {
        "message": options["message"],
        "scope": scope.describe(),
        "passages": [grounding.passage_record(p.number, passage) for p, passage in zip(shown, passages, strict=False)],
        "sentences": [asdict(check) for check in checks],
        "support": support,
    }
    result.note = draft_note(support, passages=len(shown), left_out=len(passages) - len(shown))
    return result


def draft_note(support: dict, *, passages: int, left_out: int = 0) -> str:
    if not passages:
        return (
            "No passage of the documents in scope matched the message, so this draft rests on nothing: "
            "every sentence is flagged. Choose other documents, or write the reply yourself."
        )
    note = (
        f"Grounded on {passages} passage(s). {support['supported']} of {support['sentences']} sentence(s) are "
        "supported by the passages they cite"
    )
    flagged = []
    if support["uncited"]:
        flagged.append(f"{support['uncited']} cite(s) no passage")
    if support["unsupported"] - support["uncited"]:
        flagged.append(f"{support['unsupported'] - support['uncited']} cite(s) passages that do not support them")
    note += ("; " + " and ".join(flagged) + ", and are flagged for checking.") if flagged else "."
    if support["unknown_citations"]:
        listed = ", ".join(f"[{n}]" for n in support["unknown_citations"])
        note += f" The citation(s) {listed} name no passage and are not linked."
    if left_out:
        note += f" {left_out} more passage(s) were found but did not fit in the model's context."
    return note


# --- chat ------------------------------------------------------------------------------------


def run_chat(job: Job, client: EngineClient) -> TaskResult:
    options = job.options
    run = run_engine(job, engine_request(job, options["messages"], int(options["max_tokens"]), part="chat"), client)
    return TaskResult(text=run.text, runs=[run], visible=run)


RUNNERS = {
    JobKind.SUMMARISE: run_summary,
    JobKind.EXTRACT_CLAUSES: run_clauses,
    JobKind.DRAFT: run_draft,
    JobKind.CHAT: run_chat,
}


def timing_source(result: TaskResult) -> EngineRun | None:
    """The request whose tokens describe what the user felt: the one that streamed to them, or
    else the first."""
    return result.visible or (result.runs[0] if result.runs else None)
