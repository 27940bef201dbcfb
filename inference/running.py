"""How each kind of job talks to the engine host, inside a worker.

A runner takes a claimed job and the attempt that holds it, and returns a ``TaskResult``: the
text, a note, the kind's result (``job_results``) and every engine request it made (for the metrics).
``lifecycle.job_run_next`` claims the job, calls the runner of its kind, and stores what it
returns. Runners stream what the user should watch (``visible`` requests) to the job's Redis
stream; the others (a long document's sections, JSON) report progress instead, and each of them
is kept on the job as it finishes (``Job.checkpoint``), so that an attempt after a lost worker
or a dead engine does not ask for it again. Every event and every kept part is fenced
(``fencing``), and the attempt is checked between every step: a cancel, a lost claim or the
deadline stops it there, and its open engine request is closed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connections

from inference import fencing, grounding, streaming
from inference.attempts import Attempt, OpenRequests, StopReason
from inference.clauses import clause_schema, parse_answer, quote_choices, verify_clauses
from inference.drafting import DRAFT_MAX_TOKENS, check_support, support_summary
from inference.engine.client import EngineClient
from inference.engine.protocol import GenerateRequest, Priority
from inference.job_options import ChatOptions, ClauseOptions, DraftOptions, Sampling, SummaryOptions, storable_text
from inference.job_results import (
    ChatResult,
    ClauseResult,
    DraftResult,
    DroppedQuote,
    JobResult,
    Partial,
    SummaryResult,
    Support,
)
from inference.models import Job, JobKind, Queue
from inference.prompts import (
    PageText,
    clause_instruction,
    combine_messages,
    draft_messages,
    section_messages,
    summary_instruction,
)
from inference.quotes import running_lines
from inference.sourcing import SourcePassage, Statement, source_statements
from inference.summarise import Section, group_partials, split_sections
from inference.timing import Delta

if TYPE_CHECKING:
    from documents.models import Document

logger = logging.getLogger(__name__)

PRIORITY_FOR_QUEUE = {Queue.PREFILL: Priority.PREFILL, Queue.DECODE: Priority.DECODE}
# Token batches to the browser (0: every delta as it arrives, a chunk per engine step, as vLLM's
# own server sends them: a batch would show a client a stall between its tokens that was not
# there, and on this CPU steps are slower than any batch anyway). Each publish also checks for a
# cancel and the claim.
PUBLISH_INTERVAL_S = 0.0
# Token batches to the stream when a reader in the same process has each token as it arrives
# (``/v1`` run in the web process: ``Attempt.listener``): the stream is then only the record that
# other readers (the job's page, a client that reconnects) follow, and a fenced broker round trip
# per token was a fifth of the web process's CPU time under load (py-spy, four streamed chats on
# the 2-core box), taken from the engine beside it. Each batch still checks for a cancel and the
# claim, so a cancel is seen within this time.
LISTENED_PUBLISH_INTERVAL_S = 0.25
HIDDEN_CANCEL_CHECK_S = 0.5  # how soon a cancel is seen while a hidden request writes
PARTIAL_SUMMARY_MAX_TOKENS = 320
CLAUSES_MAX_TOKENS = 1024


@dataclass
class EngineRun:
    text: str = ""
    deltas: list[Delta] = field(default_factory=list)
    admitted: dict = field(default_factory=dict)
    done: dict = field(default_factory=dict)


@dataclass
class TaskResult:
    text: str = ""
    note: str = ""
    data: JobResult = field(default_factory=ChatResult)  # stored as ``Job.result_data``
    runs: list[EngineRun] = field(default_factory=list)  # every engine request, in order
    visible: EngineRun | None = None  # the one the user watched stream, if any
    resumed: int = 0  # hidden requests answered from the job's checkpoint instead of the engine
    verbatim: bool = False  # stored as written (a raw completion's whitespace is part of it), else stripped
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _served_model: str | None = field(default=None, repr=False, compare=False)

    def kept_answer(self, job: Job, client: EngineClient, key: str) -> str | None:
        """The answer an earlier attempt (or the failed job a person tried again) kept for the
        request ``key``, if the engine serves the model that wrote it (parts kept before models
        were recorded count as the same model)."""
        kept = (job.checkpoint or {}).get(key)
        if kept is None:
            return None
        model = kept.get("model")
        if model is not None:
            with self._lock:
                if self._served_model is None:
                    self._served_model = str(client.stats().get("model"))
            if model != self._served_model:
                return None
        return str(kept["text"])

    def run_hidden(
        self,
        job: Job,
        client: EngineClient,
        attempt: Attempt,
        request: GenerateRequest,
        group: SectionGroup | None = None,
    ) -> str:
        """The text of one request whose tokens the user does not watch: from the job's
        checkpoint when an earlier attempt finished the same request, else from the engine (and
        then kept in the checkpoint). Safe to call from several threads at once (``map_sections``)."""
        key = request_fingerprint(request)
        kept = self.kept_answer(job, client, key)
        if kept is not None:
            with self._lock:
                self.resumed += 1
            return kept
        if group is not None:
            group.check()
        run = run_engine(job, request, client, attempt, visible=False, group=group)
        if not run.done:  # closed by its group (another section failed): not an answer to keep
            raise SectionAbandoned()
        with self._lock:
            self.runs.append(run)
        fencing.checkpoint_add(attempt, key, {"text": run.text, "model": run.admitted.get("model")})
        return run.text


class SectionAbandoned(Exception):
    """A section's request was closed because another section of the same job failed."""


class SectionGroup(OpenRequests):
    """The engine requests of one job's sections running at once: when one fails, the others
    are closed (``abandon``), and those not started yet do not start (``check``)."""

    abandon = OpenRequests.close_all

    def check(self) -> None:
        if self.closing:
            raise SectionAbandoned()


def map_sections(
    job: Job,
    client: EngineClient,
    attempt: Attempt,
    result: TaskResult,
    requests: list[GenerateRequest],
    *,
    doing: str,
) -> list[str]:
    """The answers of a long document's section requests, in section order, up to
    ``APPLIANCE_PREFILL_CONCURRENCY`` (the prefill queue's cap) at a time: the engine batches
    their prefill chunks and decodes their answers together, so a long document takes about as
    long as its reading, not as its sections one after another. Each answer is kept as it
    finishes (``run_hidden``). Progress says how many parts are done and, from the rate of those
    read here, about how long the rest will take. If one fails, the others are closed, those
    not started do not start, and its error goes on."""
    if len(requests) == 1:  # one part: nothing to run beside it
        _progress(attempt, doing)
        return [result.run_hidden(job, client, attempt, requests[0])]
    at_once = max(1, min(int(settings.APPLIANCE_PREFILL_CONCURRENCY), len(requests)))
    sizes = [sum(len(m["content"]) for m in request.messages) for request in requests]
    answers: list[str | None] = [None] * len(requests)
    group = SectionGroup()
    started = time.monotonic()
    read_here = 0  # characters of the sections the engine answered here (not from the checkpoint)
    _progress(attempt, f"{doing}: {len(requests)} parts, {at_once} at a time")

    from_engine = [result.kept_answer(job, client, request_fingerprint(request)) is None for request in requests]

    def one(index: int) -> int:
        try:
            answers[index] = result.run_hidden(job, client, attempt, requests[index], group)
            return index
        except BaseException:
            group.abandon()  # here, before this thread takes the next part from the pool's queue
            raise
        finally:
            connections.close_all()  # this thread's database connection

    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix=f"job-{job.pk}-part") as pool:
        pending = {pool.submit(one, i) for i in range(len(requests))}
        try:
            abandoned = False
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: isinstance(f.exception(), SectionAbandoned)):
                    if isinstance(future.exception(), SectionAbandoned):
                        abandoned = True  # closed because another part failed: that part's error goes on
                        continue
                    index = future.result()  # a part's error leaves from here
                    read_here += sizes[index] if from_engine[index] else 0
                finished = sum(a is not None for a in answers)
                if pending and not abandoned:
                    left = sum(size for size, answer in zip(sizes, answers, strict=True) if answer is None)
                    eta = left * (time.monotonic() - started) / read_here if read_here else None
                    _progress(
                        attempt,
                        f"{doing}: {finished} of {len(requests)} parts done"
                        + (f", about {_duration(eta)} left" if eta is not None else ""),
                    )
            if abandoned:  # every part ended and none said why (it cannot happen: the failed one abandons)
                raise SectionAbandoned()
        except BaseException:
            group.abandon()
            for future in pending:
                future.cancel()
            raise
    attempt.check()
    return [str(answer) for answer in answers]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(5, round(seconds / 5) * 5):.0f} s"
    return f"{round(seconds / 60):.0f} min"


def request_fingerprint(request: GenerateRequest) -> str:
    """What makes an answer: the prompt and every option that shapes the output, not the
    request's id, attempt or scheduling hints. The same section of the same document, cut the
    same way and asked with the same options, has the same fingerprint."""
    message = request.to_message()
    for name in ("request_id", "user", "cache_salt", "suspect", "priority", "queue"):
        message.pop(name, None)
    return hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()[:32]


def engine_request(
    job: Job,
    messages: list[dict[str, str]],
    max_tokens: int,
    *,
    part: str,
    json_schema: dict | None = None,
    prompt: str = "",
) -> GenerateRequest:
    """One request of ``job``: for its owner (the engine takes turns between users), and marked
    ``suspect`` once the engine has died with the job in it (the host runs suspects apart).
    ``prompt``: a raw prompt instead of ``messages`` (then empty)."""
    sampling = Sampling.from_json(job.options)
    free_text = json_schema is None and job.kind in (JobKind.SUMMARISE, JobKind.DRAFT)
    return GenerateRequest(
        request_id=f"{job.pk}-{job.attempts}-{part}",
        messages=messages,
        max_tokens=max_tokens,
        priority=PRIORITY_FOR_QUEUE[Queue(job.queue)],
        queue=job.queue,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=replay_seed(job, part) if _replayable(sampling) else sampling.seed,
        stop=list(sampling.stop),
        frequency_penalty=(
            sampling.frequency_penalty
            if sampling.frequency_penalty is not None
            else settings.APPLIANCE_FREQUENCY_PENALTY
            if free_text
            else 0.0
        ),
        ignore_eos=sampling.ignore_eos,
        json_schema=json_schema,
        extras=sampling.extras,
        user=str(job.owner_id),
        cache_salt=cache_salt(job),
        suspect=job.engine_crashes >= 1,
        prompt=prompt,
    )


def _replayable(sampling: Sampling) -> bool:
    """Whether a request is given ``replay_seed``: sampled, sent with no seed, and with no top-p
    or top-k filter. With a filter, one seeded request in a GPU's batch sends the whole batch's
    sampling off FlashInfer's kernels to PyTorch's own (vLLM's ``TopKTopPSampler.forward_cuda``:
    FlashInfer takes no per-request generator), a sort of every row's vocabulary each step;
    without one, vLLM samples natively either way, and a seed costs a draw per request."""
    return sampling.seed is None and sampling.temperature > 0 and sampling.top_p >= 1.0 and sampling.extras.top_k <= 0


def replay_seed(job: Job, part: str) -> int:
    """The seed of a sampled request that was sent without one: drawn from the job and the
    request's part, the same on every attempt. An attempt started again (its worker or the
    engine was lost) then writes the answer the first was writing, so a stream that had sent
    part of it goes on to the stored answer instead of ending in an error (``StreamDiverged``:
    "send the request again"); OpenAI's default temperature is 1, so that was most ``/v1``
    requests. Each job still draws its own (job ids are random); a seed given is used as given.
    Only where it costs no sampler speed (``_replayable``)."""
    digest = hashlib.sha256(f"{job.pk}:{part}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def cache_salt(job: Job) -> str:
    """Whose prefix cache the requests of ``job`` may share. A prompt found in the cache is read
    faster, and a job's metrics say how many of its tokens were found: one cache for everyone
    would let a person test guesses of text in prompts they cannot read (a clause of another
    team's contract, another person's draft or chat) by sending the guess and timing it. So a
    prompt shares the cache only with those who may read all of it: a document task whose prompt
    is the document and the appliance's own instructions (a summary with no focus, a clause
    extraction, whose categories are the taxonomy's) with every task on that document; anything
    with text a person wrote (a focus, a draft's message and passages, a chat) with its owner's
    own requests alone."""
    if job.document_id is not None and (
        job.kind == JobKind.EXTRACT_CLAUSES
        or (job.kind == JobKind.SUMMARISE and not SummaryOptions.from_json(job.options or {}).focus.strip())
    ):
        return f"document-{job.document_id}"
    return f"user-{job.owner_id}"


def run_engine(
    job: Job,
    request: GenerateRequest,
    client: EngineClient,
    attempt: Attempt,
    *,
    visible: bool = True,
    group: SectionGroup | None = None,
) -> EngineRun:
    """One engine request. ``visible``: its tokens go to the job's stream (the first at once,
    later ones in batches of at most ``PUBLISH_INTERVAL_S``, by default each as it arrives; one
    broker round trip per batch, which also checks for a cancel and the claim), and each to the
    attempt's listener as it arrives, if it has one (the stream's batches are then
    ``LISTENED_PUBLISH_INTERVAL_S``).
    Otherwise only waiting and progress events go out, and a cancel is checked twice a second.
    Whatever stops the attempt (here, or in its watch thread) closes the request, and the engine
    host aborts it; ``AttemptStopped`` then leaves from here."""
    run = EngineRun()
    parts: list[str] = []
    pending: list[str] = []
    pending_times: list[list[float]] = []
    last_publish = 0.0
    listened = attempt.listener is not None  # each token is handed to it, the stream gets batches
    interval = LISTENED_PUBLISH_INTERVAL_S if listened else PUBLISH_INTERVAL_S

    def delta(texts: list[str], times: list[list[float]], finish: str | None) -> dict:
        # Each delta says how many tokens it carries, when each of them reached the worker (a
        # batch hides the gaps between them) and the prompt's length, so that a client can time
        # every token (``manage.py specsheet``, ``continuous_usage_stats``); the request's last
        # says why it ended, so that ``/v1`` puts the finish on the last text's chunk.
        data = {"text": "".join(texts), "tokens": sum(int(n) for _, n in times), "times": list(times)}
        if run.admitted and "prompt_tokens" in run.admitted:
            data["prompt_tokens"] = run.admitted["prompt_tokens"]
        if finish:
            data["finish_reason"] = finish
        return data

    def flush(now: float, finish: str | None = None) -> None:
        nonlocal last_publish
        last_publish = now
        data = delta(pending, pending_times, finish)
        pending[:], pending_times[:] = [], []
        fencing.publish(attempt, "delta", data, delivered=listened)

    attempt.check()
    aborts = []

    def opened(abort) -> None:
        aborts.append(abort)
        attempt.opened(abort)
        if group is not None:
            group.opened(abort)

    # The watch thread closes the request at the deadline; the idle timeout is only a backstop.
    events = client.generate(request, idle_timeout_s=attempt.remaining_s() + 30, opened=opened)
    try:
        for event in events:
            if event.type == "admitted":
                run.admitted = event.data
            elif event.type == "waiting":  # for KV budget or its prefill turn; once a second
                data = {"reason": event.data.get("reason"), "position": event.data.get("position")}
                fencing.publish(attempt, "waiting", data)
            elif event.type == "prefill":  # reading the prompt; once a second
                data = {
                    "prompt_tokens_done": event.data.get("tokens_done"),
                    "prompt_tokens": event.data.get("prompt_tokens"),
                }
                fencing.publish(attempt, "progress", data)
            elif event.type == "delta":
                text = storable_text(event.data["text"])  # a byte token may decode to a NUL
                parts.append(text)
                run.deltas.append(Delta(at=event.received_at, tokens=int(event.data.get("tokens", 0))))
                if visible:
                    times = [round(event.received_at, 4), int(event.data.get("tokens", 0))]
                    pending.append(text)
                    pending_times.append(times)
                    finish = event.data.get("finish_reason")
                    if listened:
                        fencing.deliver(attempt, "delta", delta([text], [times], finish))
                    if len(run.deltas) == 1 or finish or event.received_at - last_publish >= interval:
                        flush(event.received_at, finish)
                elif event.received_at - last_publish >= HIDDEN_CANCEL_CHECK_S:
                    last_publish = event.received_at
                    if streaming.cancel_requested(job.pk):
                        attempt.stop(StopReason.CANCELLED)
            elif event.type == "done":
                run.done = event.data
                if pending:
                    flush(event.received_at)
            attempt.check()  # leaving the loop closes the stream: the engine host aborts the request
    finally:
        events.close()
        for abort in aborts:
            attempt.closed(abort)
            if group is not None:
                group.closed(abort)
    attempt.check()  # the stream ended because the attempt was stopped from its watch thread
    run.text = "".join(parts)
    return run


def _document_of(job: Job) -> Document:
    """The document a summary or a clause extraction is of (a job of those kinds always has one)."""
    if job.document is None:
        raise ValueError(f"a {job.kind} job has no document")
    return job.document


def _progress(attempt: Attempt, step: str) -> None:
    fencing.publish(attempt, "progress", {"step": step})


def _document_sections(job: Job, client: EngineClient, attempt: Attempt) -> tuple[list[PageText], list[Section]]:
    _progress(attempt, "Cutting the document into parts the model can read")
    document = _document_of(job)
    pages = [PageText(p.number, p.text) for p in document.pages.order_by("number").only("number", "text")]
    context = int(client.stats()["max_model_len"])
    sections = split_sections(title=document.title, pages=pages, context_tokens=context, count_many=client.count_tokens)
    attempt.check()
    return pages, sections


# --- summaries -------------------------------------------------------------------------------


def run_summary(job: Job, client: EngineClient, attempt: Attempt) -> TaskResult:
    """The summary (``_summarise``), then the page each of its statements comes from."""
    result = _summarise(job, client, attempt)
    if result.text:
        _progress(attempt, "Finding the page of each statement")
        statements = summary_statements(job.document, result.text)
        assert isinstance(result.data, SummaryResult)
        result.data = replace(result.data, statements=None if statements is None else tuple(statements), sourced=True)
    return result


def summary_statements(document, text: str) -> list[Statement] | None:
    """Each sentence of ``text`` with the page of ``document`` it comes from (``sourcing``), or
    None while the document's passages are embedded by another model than the one loaded."""
    from documents.embeddings import get_embedder
    from documents.models import Chunk

    embedder = get_embedder()
    chunks = Chunk.objects.filter(document=document, embedding__isnull=False)
    if chunks.exclude(embedding_model=embedder.model_name).exists():
        return None
    passages = [
        SourcePassage(page_start, page_end, vector, text)
        for page_start, page_end, vector, text in chunks.values_list("page_start", "page_end", "embedding", "text")
        if vector is not None  # none is: the query keeps embedded chunks only
    ]
    last_page = document.pages_total or max((p.page_end for p in passages), default=1)
    return source_statements(text, passages, last_page=last_page, embed=embedder.encode)


def _summarise(job: Job, client: EngineClient, attempt: Attempt) -> TaskResult:
    """One request when the document fits in one section; otherwise each section is summarised
    (hidden), then the partial summaries are combined (in groups while they do not fit together),
    and the last combination streams to the user. Each partial and combination is kept as it
    finishes, so that an attempt after a lost worker or a dead engine starts where this one
    stopped (``TaskResult.run_hidden``)."""
    title = _document_of(job).title
    options = SummaryOptions.from_json(job.options)
    length, focus = options.length, options.focus
    max_tokens = options.max_tokens or settings.APPLIANCE_SUMMARY_MAX_TOKENS
    pages, sections = _document_sections(job, client, attempt)
    summary = SummaryResult(sections=tuple(s.page_label for s in sections))
    result = TaskResult(data=summary)
    if len(sections) == 1:
        messages = section_messages(
            title=title, pages=list(sections[0].pages), instruction=summary_instruction(length=length, focus=focus)
        )
        run = run_engine(job, engine_request(job, messages, max_tokens, part="summary"), client, attempt)
        result.runs.append(run)
        result.visible, result.text = run, run.text
        return result

    requests = [
        engine_request(
            job,
            section_messages(
                title=title,
                pages=list(section.pages),
                instruction=summary_instruction(length=length, focus=focus, part=section.page_label),
            ),
            PARTIAL_SUMMARY_MAX_TOKENS,
            part=f"s{section.index}",
        )
        for section in sections
    ]
    answers = map_sections(job, client, attempt, result, requests, doing="Reading the document")
    partials = [(section.page_label, answer) for section, answer in zip(sections, answers, strict=True)]
    summary = replace(summary, partials=tuple(Partial(label, text) for label, text in partials))
    result.data = summary

    context = int(client.stats()["max_model_len"])

    def fits(group: list[tuple[str, str]]) -> bool:
        messages = combine_messages(title=title, partials=group, length=length, focus=focus)
        return client.count_tokens([messages])[0] + max_tokens <= context

    round_ = 0
    groups = group_partials(partials, fits=fits)
    while len(groups) > 1:
        round_ += 1
        requests = [
            engine_request(
                job,
                combine_messages(title=title, partials=group, length="detailed", focus=focus),
                PARTIAL_SUMMARY_MAX_TOKENS,
                part=f"r{round_}-{index}",
            )
            for index, group in enumerate(groups)
        ]
        answers = map_sections(
            job, client, attempt, result, requests, doing=f"Combining {len(partials)} partial summaries"
        )
        partials = [(f"{group[0][0]} to {group[-1][0]}", answer) for group, answer in zip(groups, answers, strict=True)]
        groups = group_partials(partials, fits=fits)
    attempt.check()
    messages = combine_messages(title=title, partials=groups[0], length=length, focus=focus)
    run = run_engine(job, engine_request(job, messages, max_tokens, part="final"), client, attempt)
    result.runs.append(run)
    result.visible, result.text = run, run.text
    last_page = pages[-1].number
    result.note = (
        f"The document is longer than the model's context: its {last_page} pages were read in {len(sections)} "
        "parts, each summarised, then the summaries combined."
        + (f" {result.resumed} part(s) were kept from an earlier attempt at this job." if result.resumed else "")
    )
    result.data = replace(summary, resumed_parts=result.resumed)
    return result


# --- clauses ---------------------------------------------------------------------------------


def _section_quote_choices(section, stored: dict[int, str], running: set[str]) -> list:
    """The quotes a section may give, located in the stored page texts: a piece of a long page
    (``split_sections`` cuts one that does not fit) by where the piece sits in its page."""
    bases = [stored.get(page.number, "").find(page.text) for page in section.pages]
    found = quote_choices([(i, page.text) for i, page in enumerate(section.pages)], running)
    return [
        replace(
            c,
            page=section.pages[c.page].number,
            start=c.start + bases[c.page],
            end_page=section.pages[c.end_page].number,
            end=c.end + bases[c.end_page],
        )
        for c in found
        if bases[c.page] >= 0 and bases[c.end_page] >= 0  # (a piece is its page's own text)
    ]


def run_clauses(job: Job, client: EngineClient, attempt: Attempt) -> TaskResult:
    """Each section answers in JSON held to the clause schema by the engine's guided decoding
    (each answer kept as it finishes, like a summary's partials); every quote is then looked for
    in the stored page text, and what is not found is dropped."""
    title = _document_of(job).title
    options = ClauseOptions.from_json(job.options)
    categories = options.categories
    pages, sections = _document_sections(job, client, attempt)
    stored = {page.number: page.text for page in pages}
    result = TaskResult()
    raw: list[dict] = []
    offered: list = []  # the quote candidates every section was given, located in the stored pages
    running = running_lines(sorted(stored.items()))  # headers and footers, over the whole document
    cut_short = 0
    requests = []
    for section in sections:
        numbers = sorted({p.number for p in section.pages})
        messages = section_messages(title=title, pages=list(section.pages), instruction=clause_instruction(categories))
        choices = _section_quote_choices(section, stored, running)
        offered.extend(choices)
        requests.append(
            engine_request(
                job,
                messages,
                CLAUSES_MAX_TOKENS,
                part=f"c{section.index}",
                json_schema=clause_schema(categories, numbers, list(dict.fromkeys(c.text for c in choices))),
            )
        )
    answers = map_sections(job, client, attempt, result, requests, doing="Looking for clauses")
    for section, answer in zip(sections, answers, strict=True):
        found, complete = parse_answer(answer)
        if not complete:
            cut_short += 1  # the answer ran past its token limit; what it finished is kept
            logger.warning("job %s: section %s gave an incomplete answer", job.pk, section.index)
        raw.extend(found)
    attempt.check()
    verified = verify_clauses(raw, stored, categories, offered)
    clauses = verified.clauses
    result.data = ClauseResult(
        taxonomy=options.taxonomy,
        categories=tuple(categories),
        clauses=tuple(clauses),
        proposed=len(raw),
        dropped=len(verified.dropped),
        dropped_examples=tuple(DroppedQuote.from_json(d) for d in verified.dropped[:20]),
        sections=len(sections),
        incomplete_sections=cut_short,
        resumed_parts=result.resumed,
    )
    lines = [
        f"- **{c.category}** (p. {c.page}): \u201c{c.quote}\u201d" + (f" \u2014 {c.note}" if c.note else "")
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
    fencing.publish(attempt, "snapshot", {"text": result.text})
    return result


# --- drafting --------------------------------------------------------------------------------


def run_draft(job: Job, client: EngineClient, attempt: Attempt) -> TaskResult:
    """Search the owner's documents (as they may read them now) for passages that answer the
    message, number them, stream the reply, then check each of its sentences against the
    passages it cites."""
    from documents.embeddings import get_embedder

    options = DraftOptions.from_json(job.options)
    scope = grounding.Scope(document_ids=options.document_ids, group_id=options.group_id)
    embedder = get_embedder()
    _progress(attempt, "Finding the passages that answer the message")
    passages = grounding.retrieve(user=job.owner, message=options.message, scope=scope, embedder=embedder)
    attempt.check()
    shown = grounding.numbered(passages)
    max_tokens = DRAFT_MAX_TOKENS[options.length]
    context = int(client.stats()["max_model_len"])
    while True:  # the best passages that fit beside the message and the answer
        messages = draft_messages(message=options.message, passages=shown, tone=options.tone, length=options.length)
        prompt_tokens = client.count_tokens([messages])[0]
        attempt.check()
        if prompt_tokens + max_tokens <= context or not shown:
            break
        shown.pop()
    if prompt_tokens + max_tokens > context:
        raise ValueError(
            f"The incoming message is too long for the model: it takes {prompt_tokens} of the "
            f"{context} tokens the model reads, with {max_tokens} more needed for the reply. Shorten it."
        )
    run = run_engine(job, engine_request(job, messages, max_tokens, part="draft"), client, attempt)
    result = TaskResult(text=run.text, runs=[run], visible=run)
    _progress(attempt, "Checking each sentence against the passages it cites")
    checks = check_support(run.text, shown, embed=embedder.encode)
    support = support_summary(checks)
    result.data = DraftResult(
        message=options.message,
        scope=scope.describe(),
        passages=tuple(
            grounding.passage_record(p.number, passage) for p, passage in zip(shown, passages, strict=False)
        ),
        sentences=tuple(checks),
        support=Support.from_json(support),
    )
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


def run_chat(job: Job, client: EngineClient, attempt: Attempt) -> TaskResult:
    options = ChatOptions.from_json(job.options)
    request = engine_request(
        job,
        list(options.messages),
        options.max_tokens,
        part="chat",
        json_schema=options.json_schema,
        prompt=options.prompt,
    )
    run = run_engine(job, request, client, attempt)
    data = ChatResult(finish_reason=str((run.done or {}).get("finish_reason") or ""))
    return TaskResult(text=run.text, data=data, runs=[run], visible=run, verbatim=bool(options.prompt))


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
