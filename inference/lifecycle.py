"""Writes of a job's life after it is created: sent to its queue, claimed by fair share, run
under a fencing token, stored, put back to wait for the engine, failed, handed on by the
watchdog. Tasks and services call these; ``services`` creates and cancels jobs.

- **Messages are turns, not jobs.** Each queued job has one ``run_job`` message in its Celery
  queue, but a worker that takes a message runs the *next job by fair share* of that queue
  (``job_claim_next``: the owner with the fewest jobs running there, then the one served least
  recently, then their oldest job), so one person's batch does not hold another person's single
  job behind it. A message that finds nothing to claim ends, or comes back later while jobs wait
  for the engine.
- **The attempt number is a fencing token.** A claim raises ``Job.attempts`` and sets the
  job's fence in the broker; everything the attempt writes is conditional on both
  (``fencing``), so an attempt the watchdog gave up on writes nothing once it wakes.
- **Time limits on every pool.** Each attempt has a deadline (``APPLIANCE_JOB_TIME_LIMIT_S``)
  checked where it checks for a cancel and enforced by its watch thread, because Celery's time
  limits do nothing in the ``threads`` pools the inference workers use. The Celery limits stay,
  a little later, for pools that honour them.
- **Engine deaths.** A job that was in the engine when it died is tried again soon, marked a
  suspect (the host runs suspects apart), without counting an attempt; the second time it is
  failed with a reason. A job that could not reach the engine waits and retries for
  ``APPLIANCE_ENGINE_RETRY_WINDOW_S``.
- **Nothing queued that nothing will run.** ``dispatched_at`` says a job's message was
  published; the watchdog publishes one for a queued job whose web process died between its
  commit and its publish, and for every queued job once the broker has lost its queues
  (``appliance.broker.forgot``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Count, F, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from appliance import cluster
from appliance.broker import PUBLISH_ERRORS, send_unsent, unsent_if_forgotten
from appliance.rendering import render_markdown
from documents.selectors import documents_readable_by
from inference import fencing, placement, running, streaming
from inference.attempts import Attempt, AttemptStopped, Listener, StopReason, time_limit_reason
from inference.engine.client import EngineClient, EngineRequestError, EngineRestarting, EngineUnavailable
from inference.fencing import attempt_watch, held
from inference.job_options import storable, storable_text
from inference.job_results import SummaryResult, statement_to_json
from inference.models import Job, JobKind, Queue, RequestMetrics
from inference.timing import request_timing

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 4  # times a worker may start a job before it is failed (a job that kills workers)
ENGINE_CRASH_LIMIT = 2  # times the engine may die with a job in it before the job is failed
ENGINE_CRASH_RETRY_S = 2  # the host restarts its engine core in tens of seconds; ask again soon
DISPATCH_GRACE_S = 30  # a queued job unpublished for this long lost its publisher: the watchdog sends it
TIME_LIMIT_GRACE_S = 30  # Celery's own limits come this much after the attempt's deadline
IDLE_TURN_RETRY_S = 1.0  # a turn that found only jobs another transaction had locked comes back

ENGINE_CRASHED_TWICE = (
    "The engine stopped twice while this job was running: it was in the engine both times the engine "
    "stopped, so it is not tried again: it may be what stops it. The administrator can find why in the "
    "engine host's log."
)


def celery_queue_for(queue: Queue | str) -> str:
    """The Celery queue a job of this logical queue is sent to. Under ``fifo`` scheduling (a
    baseline for ``bench scheduling``) every job goes through one queue, and fair share then
    spans both kinds of job."""
    if settings.APPLIANCE_SCHEDULING == "fifo":
        return str(Queue.PREFILL)
    return str(queue)


def engine_retry_delays_s(window_s: float) -> list[int]:
    """Pauses between retries while the engine host is down: 2, 4, 8, 16, then every 30 s, until
    they add up to ``window_s`` (an engine host restarts in about two minutes)."""
    delays: list[int] = []
    while sum(delays) < window_s:
        delays.append(min(30, 2 ** (len(delays) + 1)))
    return delays


# --- sending ---------------------------------------------------------------------------------


def job_dispatch(*, job_id, celery_queue: str | None = None, countdown_s: float | None = None) -> None:
    """Publish one ``run_job`` message (a turn) to the job's Celery queue (read from its row
    unless given), then record that it was. Raises one of ``PUBLISH_ERRORS`` when the broker
    does not take it (bounded by the settings' publish retry policy)."""
    if _publish_turn(job_id, countdown_s=countdown_s, celery_queue=celery_queue):
        Job.objects.filter(pk=job_id, state=Job.State.QUEUED, dispatched_at=None).update(dispatched_at=timezone.now())


def _publish_turn(job_id, *, countdown_s: float | None = None, celery_queue: str | None = None, hops: int = 0,
                  to_queue: str | None = None) -> bool:  # fmt: skip
    """``to_queue``: the queue it is sent to, if not ``celery_queue`` (an engine's own, ``placement``)."""
    from inference.tasks import run_job

    if not celery_queue:
        row = Job.objects.filter(pk=job_id).values("celery_queue", "queue").first()
        if row is None:
            return False
        celery_queue = row["celery_queue"] or celery_queue_for(row["queue"])
    limit_s = settings.APPLIANCE_JOB_TIME_LIMIT_S
    run_job.apply_async(
        args=[str(job_id)],
        kwargs={"celery_queue": celery_queue, **({"hops": hops} if hops else {})},
        queue=to_queue or celery_queue,
        countdown=countdown_s,
        soft_time_limit=limit_s + TIME_LIMIT_GRACE_S,
        time_limit=limit_s + 2 * TIME_LIMIT_GRACE_S,
    )
    return True


def jobs_dispatch_pending() -> int:
    """Publish the message of each queued job that has none (its web process or worker died
    between writing the row and publishing), once (``appliance.broker.send_unsent``). Returns
    how many were sent."""
    cutoff = timezone.now() - timedelta(seconds=DISPATCH_GRACE_S)
    unsent = Job.objects.filter(state=Job.State.QUEUED, dispatched_at=None, created_at__lt=cutoff).filter(
        Q(claimed_at=None) | Q(claimed_at__lt=cutoff)
    )

    def publish(job_id, celery_queue: str, queue: str) -> None:
        _publish_turn(job_id, celery_queue=celery_queue or celery_queue_for(queue))

    return send_unsent(unsent, publish, what="job", fields=("celery_queue", "queue"))


def jobs_unsent_if_the_broker_forgot() -> int:
    """Mark every queued job's message unsent when the broker may have lost its queues (it came
    back empty or restarted: ``appliance.broker.forgot``), for ``jobs_dispatch_pending`` to
    send again: their turns may have gone with them, and each job would wait for ever. Returns
    how many; raises one of ``PUBLISH_ERRORS`` while the broker does not answer."""

    def mark_unsent() -> int:
        return Job.objects.filter(state=Job.State.QUEUED).exclude(dispatched_at=None).update(dispatched_at=None)

    return unsent_if_forgotten("jobs", mark_unsent)


# --- claiming --------------------------------------------------------------------------------


def _claim(job_id, *, engine: str = "") -> Job | None:
    now = timezone.now()
    claimed = Job.objects.filter(pk=job_id, state=Job.State.QUEUED).update(
        engine=engine,
        state=Job.State.RUNNING,
        started_at=Coalesce(F("started_at"), now),
        attempts=F("attempts") + 1,
        heartbeat_at=now,
        claimed_at=now,
        not_before=None,
    )
    if not claimed:
        return None
    return Job.objects.select_related("document", "owner").get(pk=job_id)


def startable(*, celery_queue: str):
    """The queued jobs of a Celery queue that may start now (none held back until later)."""
    return Job.objects.filter(celery_queue=celery_queue, state=Job.State.QUEUED).filter(
        Q(not_before=None) | Q(not_before__lte=timezone.now())
    )


def fair_share_candidates(*, celery_queue: str):
    """The queued jobs of a Celery queue that may start now, in fair-share order
    (``inference.fairshare`` states the rule; ``selectors.queue_positions`` plays it forward)."""
    same_owner = Job.objects.filter(owner=OuterRef("owner"), celery_queue=celery_queue).order_by()
    running_jobs = same_owner.filter(state=Job.State.RUNNING).values("owner").annotate(n=Count("pk")).values("n")[:1]
    last_served = same_owner.filter(claimed_at__isnull=False).order_by("-claimed_at").values("claimed_at")[:1]
    return (
        startable(celery_queue=celery_queue)
        .annotate(owner_running=Coalesce(Subquery(running_jobs), 0), owner_served=Subquery(last_served))
        .order_by("owner_running", F("owner_served").asc(nulls_first=True), "created_at", "pk")
    )


def job_claim_next(
    *, celery_queue: str, place: Turn | None = None, engine: str = "", marks: dict[str, float] | None = None
) -> Job | None | placement.Decision:
    """Claim the next job of a Celery queue by fair share. Claims of one queue take turns (a
    transaction-scoped advisory lock), so each sees the running counts the one before it left;
    a row another transaction holds is passed over, or waited for when all are (``_unheld``).
    With other engines in the cluster (``place``), placement may take a later job of the order,
    or pass the turn on (its decision is returned)."""
    with transaction.atomic():
        take_claim_turn(celery_queue)
        if marks is not None:
            marks["locked"] = time.monotonic()  # when this claim's turn came (``_note_slow_claim``)
        candidates = fair_share_candidates(celery_queue=celery_queue)
        if place is None:
            first = _unheld(candidates, ("pk",), 1)
            return _claim(first[0][0], engine=engine) if first else None
        rows = _unheld(candidates, ("pk", "document_id", "created_at"), placement.CANDIDATES)
        decision = place.choose(rows)
        if decision.action == "pass":
            logger.info("a turn of %s passed from %s to %s: %s", celery_queue, place.here, decision.to, decision.reason)
            return decision
        return None if decision.job_id is None else _claim(decision.job_id, engine=place.here)


# How long a claim waits for a queued job's row that another transaction holds, when every job
# that may start is so held. Its creator holds it for a moment just after sending its message
# (to record that it was sent), and a cancel does too: before, a turn that met that moment found
# nothing, and came back a second later (``IDLE_TURN_RETRY_S``), or a later job's turn took the
# job meanwhile; that was the slowest drafters' whole wait for a worker (300-1,000 ms where the
# claim itself takes 10 ms) in the steady scheduling benchmark.
HELD_ROW_WAIT_MS = 2000


def _unheld(candidates, fields: tuple[str, ...], limit: int) -> list[tuple]:
    """The first ``limit`` candidates (``fields`` of each) in order, locked for this claim: those
    no other transaction holds or, when every candidate is held, the first ones once they are
    let go (at most ``HELD_ROW_WAIT_MS``; nothing if they are not)."""
    rows = list(candidates.select_for_update(skip_locked=True, of=("self",)).values_list(*fields)[:limit])
    if rows or not candidates.exists():
        return rows
    try:
        # A savepoint: a lock timeout undoes it, not the claim's transaction. The timeout is the
        # transaction's own (SET LOCAL), and this is the claim's last wait for a lock.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{HELD_ROW_WAIT_MS}ms"])
            return list(candidates.select_for_update(of=("self",)).values_list(*fields)[:limit])
    except OperationalError:  # still held: this turn comes back later (``_turn_later``)
        return []


def _turn_later(*, celery_queue: str, job_id) -> None:
    """A turn that found nothing to start. If jobs of the queue still wait (for the engine to
    come back, or locked by another transaction), the turn comes back when the first may start,
    so that no waiting job is left without one; otherwise it ends here."""
    now = timezone.now()
    waiting = Job.objects.filter(celery_queue=celery_queue, state=Job.State.QUEUED).aggregate(
        ready=Count("pk", filter=Q(not_before=None) | Q(not_before__lte=now)),
        first=Min("not_before", filter=Q(not_before__gt=now)),
    )
    if not waiting["ready"] and waiting["first"] is None:
        return
    countdown = IDLE_TURN_RETRY_S if waiting["ready"] else max(0.1, (waiting["first"] - now).total_seconds())
    _publish_turn(job_id, countdown_s=countdown, celery_queue=celery_queue)


# --- placement (inference.placement decides) --------------------------------------------------


def this_engine(client: EngineClient) -> str:
    return placement.engine_key(settings.APPLIANCE_NODE_NAME, str(client.address))


def engines_serving(celery_queue: str) -> list[placement.EngineView]:
    """The engines the cluster view lists for ``celery_queue``'s workers (one in a single box)."""
    return [e for e in placement.cluster_engines(cluster.nodes()) if celery_queue in e.queues]


def take_claim_turn(celery_queue: str) -> None:
    """Wait for the queue's claim turn, held to the end of the transaction: claims of one queue
    (and a creator claiming its own job, ``services``) take turns, each seeing the counts the
    one before it left."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"inference.claim:{celery_queue}"])


@dataclass(frozen=True)
class Turn:
    """What placement decides a turn on: this worker's engine, whether it has room now, the
    other engines of the queue and how often the turn was passed on."""

    here: str
    here_room: bool
    others: list[placement.EngineView]
    hops: int

    @classmethod
    def of_this_engine(cls, *, celery_queue: str, client: EngineClient, hops: int) -> Turn | None:
        """None when the cluster view lists no other engine for the queue (one engine, the usual
        case): the turn claims in fair-share order, as it always has."""
        here = this_engine(client)
        try:
            engines = engines_serving(celery_queue)
        except PUBLISH_ERRORS:  # the broker is away: the claim below will say so
            return None
        others = [e for e in engines if e.key != here]
        if not others:
            return None
        try:
            here_room = placement.engine_has_room(client.stats(timeout_s=2.0))
        except (EngineUnavailable, EngineRequestError, OSError):  # an engine that does not answer has no room
            here_room = False
        return cls(here, here_room, others, hops)

    def choose(self, rows: list[tuple]) -> placement.Decision:
        """``rows``: (job id, document id, queued at) of the queue's candidates, in fair-share order."""
        now = timezone.now()
        engines = _remembered_engines([document for _, document, _ in rows if document is not None])
        candidates = [placement.Candidate(pk, (now - queued).total_seconds(), engines.get(document))
                      for pk, document, queued in rows]  # fmt: skip
        return placement.choose(candidates, here=self.here, here_room=self.here_room, others=self.others,
                                hops=self.hops, wait_s=settings.APPLIANCE_PLACEMENT_WAIT_S)  # fmt: skip


def _remember_engine(document_id: int, engine: str) -> None:
    try:
        streaming.sync_client().set(f"{placement.AFFINITY_PREFIX}{document_id}", engine,
                                    ex=settings.APPLIANCE_PLACEMENT_AFFINITY_TTL_S)  # fmt: skip
    except PUBLISH_ERRORS:  # a preference lost costs a prefix cache hit, nothing more
        logger.warning("the engine of document %s could not be remembered", document_id)


def _engines_down() -> list[str]:
    """The engines of nodes the cluster view shows down (none when it cannot be read)."""
    try:
        return [e.key for e in placement.cluster_engines(cluster.nodes()) if not e.up]
    except PUBLISH_ERRORS:
        return []


def _forget_engine(document_id: int, engine: str) -> None:
    key = f"{placement.AFFINITY_PREFIX}{document_id}"
    try:
        client = streaming.sync_client()
        if client.get(key) in (engine, engine.encode()):
            client.delete(key)
    except PUBLISH_ERRORS:
        logger.warning("the engine of document %s could not be forgotten", document_id)


def _remembered_engines(document_ids: list[int]) -> dict[int, str]:
    if not document_ids:
        return {}
    try:
        values = streaming.sync_client().mget([f"{placement.AFFINITY_PREFIX}{d}" for d in document_ids])
    except PUBLISH_ERRORS:
        return {}
    return {d: v.decode() if isinstance(v, bytes) else v for d, v in zip(document_ids, values, strict=True) if v}


# --- running ---------------------------------------------------------------------------------


def job_run_next(*, celery_queue: str, job_id=None, client: EngineClient | None = None, hops: int = 0) -> Job | None:
    """A worker's turn on ``celery_queue`` (the message was sent for ``job_id``, and passed on
    ``hops`` times by placement): claim the next job by fair share and run it. Returns the job as
    it ended, or None if there was none."""
    began = time.monotonic()
    client = client or EngineClient.from_settings()
    place = Turn.of_this_engine(celery_queue=celery_queue, client=client, hops=hops)
    viewed = time.monotonic()
    marks: dict[str, float] = {}
    job = job_claim_next(celery_queue=celery_queue, place=place, engine=this_engine(client), marks=marks)
    _note_slow_claim(job, began=began, viewed=viewed, locked=marks.get("locked", viewed))
    if isinstance(job, placement.Decision):  # passed on to another engine's workers
        _publish_turn(job_id, celery_queue=celery_queue, hops=hops + 1,
                      to_queue=placement.direct_queue(celery_queue, job.to))  # fmt: skip
        # Should that engine's node have stopped since it last reported, the turn would wait in
        # its queue for ever: a turn of the whole queue follows, claimed wherever it is taken.
        _publish_turn(job_id, celery_queue=celery_queue, hops=placement.MAX_HOPS,
                      countdown_s=settings.APPLIANCE_PLACEMENT_WAIT_S)  # fmt: skip
        return None
    if job is None:
        if job_id is not None:
            _turn_later(celery_queue=celery_queue, job_id=job_id)
        return None
    assert isinstance(job, Job)
    if job.document_id is not None:
        _remember_engine(job.document_id, job.engine)
    return _run(job, client)


# A claim slower than this is logged with where its time went: a drafter's whole time to first
# token is a few hundred milliseconds on a CPU, and a claim is normally a few.
SLOW_CLAIM_S = 0.25


def _note_slow_claim(job, *, began: float, viewed: float, locked: float) -> None:
    """Log a job claimed long after its message was sent, with where that time went: the
    message's way to this thread (the broker, a free thread), the cluster view, the wait for the
    queue's claim lock, and the claim's query and update."""
    claimed = time.monotonic()
    if not isinstance(job, Job) or job.dispatched_at is None:
        return
    since_sent = (timezone.now() - job.dispatched_at).total_seconds()
    if since_sent < SLOW_CLAIM_S:
        return
    ms = {
        "to a thread": since_sent - (claimed - began),
        "cluster view": viewed - began,
        "claim lock": locked - viewed,
        "claim": claimed - locked,
    }
    logger.info(  # under load a job waits for a free thread, as it should: information, not a fault
        "job %s: claimed %.0f ms after its message was sent (%s)",
        job.pk, since_sent * 1000, ", ".join(f"{name} {value * 1000:.0f} ms" for name, value in ms.items()),
    )  # fmt: skip


def job_run(*, job_id, client: EngineClient | None = None) -> Job | None:
    """Run this job now if it is queued (in-process callers and tests; workers take turns with
    ``job_run_next``). A job that is running elsewhere, finished or gone is left as it is."""
    if not Job.objects.filter(pk=job_id).exists():
        return None  # a job whose row is gone is dropped quietly
    job = _claim(job_id)
    if job is None:
        return Job.objects.get(pk=job_id)
    return _run(job, client)


def job_run_claimed(*, job_id, client: EngineClient, listener: Listener) -> Job:
    """Run a job its creator claimed for itself (``services.job_create_chat``'s ``claim_for``:
    ``/v1`` in the web process), handing ``listener`` every event it streams. Like a worker's
    attempt in all else: fenced, watched, put back to its queue for a worker if the engine is
    lost, handed on by the watchdog if this process stops."""
    job = Job.objects.select_related("document", "owner").get(pk=job_id)
    return _run(job, client, listener=listener)


def _run(job: Job, client: EngineClient | None, *, listener: Listener | None = None) -> Job:
    """Run a claimed job under its attempt: its fence, its deadline and its watch thread for the
    whole of it, then store what it made, or put it back, or fail it."""
    attempt = Attempt.starting_now(job.pk, job.attempts, limit_s=settings.APPLIANCE_JOB_TIME_LIMIT_S, listener=listener)
    streaming.fence_hold(job.pk, attempt.number)
    client = client or EngineClient.from_settings()
    failure: Exception | None = None
    with attempt_watch(attempt):
        try:
            if job.started_at != job.claimed_at:  # started before: whatever it streamed is replaced
                fencing.publish(attempt, "restart", {"attempt": attempt.number})
            runner = running.RUNNERS.get(JobKind(job.kind))
            if runner is None:
                raise ValueError(f"{job.get_kind_display()} is not available yet.")
            if job.document_id is not None and not documents_readable_by(job.owner).filter(pk=job.document_id).exists():
                raise ValueError("Its document is no longer shared with you, so this job was not run.")
            result = runner(job, client, attempt)
            attempt.check()
            return _store_result(job, attempt, result)
        except Exception as exc:  # decided below, once the watch thread has stopped
            failure = exc
    return _after_failure(job, attempt, failure)


def _after_failure(job: Job, attempt: Attempt, failure: Exception) -> Job:
    # A stop (cancel, lost claim, deadline) explains whatever error the closed request raised.
    reason = attempt.reason or (failure.reason if isinstance(failure, AttemptStopped) else None)
    if reason is StopReason.DEADLINE or (reason is None and isinstance(failure, SoftTimeLimitExceeded)):
        job_fail(job_id=job.pk, reason=time_limit_reason(settings.APPLIANCE_JOB_TIME_LIMIT_S), attempt=attempt)
    elif reason is StopReason.CANCELLED:
        streaming.fence_release(job.pk, attempt.number)  # the row says cancelled already
    elif reason is StopReason.CLAIM_LOST:
        logger.warning("job %s: attempt %s stopped, having lost its claim", job.pk, attempt.number)
    elif isinstance(failure, EngineRestarting) and failure.in_flight:
        _engine_died_under(job, attempt, failure)
    elif isinstance(failure, EngineUnavailable):
        _wait_for_engine(job, attempt, failure)
    elif isinstance(failure, EngineRequestError):
        job_fail(job_id=job.pk, reason=f"The engine refused this job: {failure.detail}", attempt=attempt)
    elif isinstance(failure, ValueError):
        job_fail(job_id=job.pk, reason=str(failure), attempt=attempt)
    else:
        logger.error("job %s failed", job.pk, exc_info=failure)
        job_fail(
            job_id=job.pk,
            reason="An internal error stopped this job; the administrator can find it in the logs.",
            attempt=attempt,
        )
    return Job.objects.get(pk=job.pk)


def _store_result(job: Job, attempt: Attempt, result: running.TaskResult) -> Job:
    with transaction.atomic():
        updated = held(attempt).update(
            state=Job.State.SUCCEEDED,
            # Whatever the model wrote, through whatever JSON escape, Postgres can store it.
            result_text=storable_text(result.text if result.verbatim else result.text.strip()),
            result_note=storable_text(result.note),
            result_data=storable(result.data.to_json()),
            finished_at=timezone.now(),
            checkpoint={},
        )
        if not updated:  # cancelled while the last tokens arrived, or handed on: keep nothing
            return Job.objects.get(pk=job.pk)
        RequestMetrics.objects.update_or_create(job=job, defaults=_metrics_fields(job, result))
    job = Job.objects.select_related("metrics").get(pk=job.pk)
    streaming.publish_fenced(job.pk, "done", metrics_summary(job), attempt=attempt.number)
    streaming.fence_release(job.pk, attempt.number)
    return job


def _put_back(job: Job, attempt: Attempt, *, delay_s: float, reason: str, **counters) -> bool:
    """Back to queued under the attempt's claim, not started before ``delay_s``, without counting
    the attempt against ``MAX_ATTEMPTS`` (the job did nothing wrong), and sent again."""
    updated = held(attempt).update(
        state=Job.State.QUEUED,
        heartbeat_at=None,
        attempts=Greatest(F("attempts") - 1, 0),
        not_before=timezone.now() + timedelta(seconds=delay_s),
        dispatched_at=None,
        **counters,
    )
    if not updated:
        return False
    streaming.fence_release(job.pk, attempt.number)
    streaming.publish_fenced(job.pk, "waiting", {"reason": reason, "position": None}, attempt=None)
    try:
        job_dispatch(job_id=job.pk, celery_queue=job.celery_queue, countdown_s=delay_s)
    except PUBLISH_ERRORS:  # the watchdog sends it once the broker is back
        logger.warning("job %s: put back, but the broker did not take its message", job.pk)
    return True


def _engine_died_under(job: Job, attempt: Attempt, exc: EngineRestarting) -> None:
    """The engine died with this job in it. Once is bad luck: try again soon, as a suspect. Twice
    means the job was in the engine each time it stopped, so it is failed rather than allowed to
    take the engine (and every job in it) down again."""
    logger.warning("job %s: the engine died under it (%s); crash %d", job.pk, exc, job.engine_crashes + 1)
    if job.engine_crashes + 1 >= ENGINE_CRASH_LIMIT:
        job_fail(job_id=job.pk, reason=ENGINE_CRASHED_TWICE, attempt=attempt, engine_crashes=F("engine_crashes") + 1)
        return
    _put_back(
        job,
        attempt,
        delay_s=ENGINE_CRASH_RETRY_S,
        reason="engine_restarting",
        engine_crashes=F("engine_crashes") + 1,
    )


def _wait_for_engine(job: Job, attempt: Attempt, exc: EngineUnavailable) -> None:
    """The engine host could not take the request (down, or starting its engine again): wait and
    retry, with growing pauses, for ``APPLIANCE_ENGINE_RETRY_WINDOW_S``."""
    delays = engine_retry_delays_s(settings.APPLIANCE_ENGINE_RETRY_WINDOW_S)
    if job.engine_waits >= len(delays):
        job_fail(job_id=job.pk, reason=f"The engine is not available: {exc}. Try again later.", attempt=attempt)
        return
    logger.warning("job %s: engine unavailable (%s); retrying in %d s", job.pk, exc, delays[job.engine_waits])
    _put_back(
        job, attempt, delay_s=delays[job.engine_waits], reason="engine_unavailable", engine_waits=F("engine_waits") + 1
    )


def job_fail(*, job_id, reason: str, attempt: Attempt | None = None, **fields) -> bool:
    """Fail a job with a reason a person understands. From its attempt: only while the attempt
    holds it. From elsewhere (the watchdog, the task's last resort): any unfinished job, and the
    attempt running it, if any, loses its fence and stops."""
    if attempt is not None:
        if not held(attempt).update(**_failed(reason, **fields)):
            return False
        streaming.publish_fenced(job_id, "failed", {"detail": reason}, attempt=attempt.number)
        streaming.fence_release(job_id, attempt.number)
        return True
    return _fail_rows(Job.objects.filter(pk=job_id).exclude(state__in=Job.FINISHED_STATES), job_id, reason, **fields)


def _failed(reason: str, **fields) -> dict:
    # The checkpoint stays: a person who tries the job again starts from its finished parts.
    # A reason may quote what a person or the model wrote: stored as Postgres can store it.
    return {"state": Job.State.FAILED, "error": storable_text(reason), "finished_at": timezone.now(), **fields}


def _fail_rows(rows, job_id, reason: str, **fields) -> bool:
    """Fail the job if ``rows`` (a filter on it) still matches; the attempt running it, if any,
    loses its fence."""
    if not rows.update(**_failed(reason, **fields)):
        return False
    streaming.fence_release(job_id)
    streaming.publish(job_id, "failed", {"detail": reason})
    return True


# --- the watchdog ----------------------------------------------------------------------------


def jobs_recover_stale() -> tuple[int, int]:
    """Jobs whose worker stopped reporting (killed, stopped, machine lost) go back to their queue,
    or fail with a reason once they have been started ``MAX_ATTEMPTS`` times. Returns (requeued,
    failed). Each hand-on is conditional on the heartbeat seen, so two watchdogs never both make
    it, and it takes the job's fence from the attempt: if that attempt was only slow, it finds
    its next write refused and stops.

    A job on an engine whose node the cluster view shows down is handed on sooner: once its
    heartbeat is two of its beats old (``APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S`` / 2), not at the
    full timeout, since the node that would beat for it has stopped reporting too.

    Run by every inference worker when it starts and then periodically (``tasks.py``)."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S)
    requeued = failed = 0
    lost = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at=None, started_at__lt=cutoff)
    down = _engines_down()
    if down:
        sooner = now - timedelta(seconds=settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S / 2)
        lost |= Q(engine__in=down) & (Q(heartbeat_at__lt=sooner) | Q(heartbeat_at=None, started_at__lt=sooner))
    stale = Job.objects.filter(state=Job.State.RUNNING).filter(lost)
    for job in stale.only("pk", "queue", "celery_queue", "attempts", "heartbeat_at", "document_id", "engine"):
        seen = Job.objects.filter(
            pk=job.pk, state=Job.State.RUNNING, attempts=job.attempts, heartbeat_at=job.heartbeat_at
        )
        if job.attempts >= MAX_ATTEMPTS:
            reason = (
                f"The worker running this job stopped {job.attempts} times, so it was given up. "
                "The administrator can find why in the logs."
            )
            failed += _fail_rows(seen, job.pk, reason)
            continue
        if not seen.update(state=Job.State.QUEUED, heartbeat_at=None, dispatched_at=None):
            continue
        logger.warning("job %s: its worker stopped reporting; sending it to the %s queue again", job.pk, job.queue)
        if job.document_id is not None and job.engine:  # its node may be lost: no job waits for it
            _forget_engine(job.document_id, job.engine)
        streaming.fence_release(job.pk, job.attempts)
        streaming.publish_fenced(job.pk, "waiting", {"reason": "worker_lost", "position": None}, attempt=None)
        try:
            job_dispatch(job_id=job.pk, celery_queue=job.celery_queue)
        except PUBLISH_ERRORS:
            logger.warning("job %s: handed on, but the broker did not take its message", job.pk)
        requeued += 1
    return requeued, failed


# --- metrics ---------------------------------------------------------------------------------


def _metrics_fields(job: Job, result: running.TaskResult) -> dict:
    """One row per job: latency from the request the user watched (or the first), tokens and
    prefill time summed over every engine request this attempt made (parts kept from an earlier
    attempt are not counted again)."""
    source = running.timing_source(result) or running.EngineRun()
    if job.started_at is None:  # set when its attempt began, before any result
        raise ValueError(f"job {job.pk} has a result but no start time")
    timing = request_timing(
        created_at=job.created_at.timestamp(), started_at=job.started_at.timestamp(), deltas=source.deltas
    )
    runs = result.runs
    prefills = [run.done.get("prefill_ms") for run in runs if run.done.get("prefill_ms") is not None]
    return {
        "queue": job.queue,
        "engine": source.admitted.get("engine", ""),
        "model": source.admitted.get("model", ""),
        "scheduling": source.admitted.get("scheduling", ""),
        "prefill_ms": sum(prefills) if prefills else None,
        "queue_wait_ms": timing.queue_wait_ms,
        # The wait for KV blocks happens inside the engine: its "done" says how long it was.
        "admission_wait_ms": sum(
            float(run.done.get("admission_wait_ms") or run.admitted.get("admission_wait_ms") or 0.0) for run in runs
        ),
        "ttft_ms": timing.ttft_ms if timing.ttft_ms is not None else 0.0,
        "itl_mean_ms": timing.itl_mean_ms,
        "itl_p95_ms": timing.itl_p95_ms,
        "prompt_tokens": sum(int(run.done.get("prompt_tokens", run.admitted.get("prompt_tokens", 0))) for run in runs),
        "cached_prompt_tokens": sum(int(run.done.get("cached_prompt_tokens", 0)) for run in runs),
        "output_tokens": sum(int(run.done.get("output_tokens", len(run.deltas))) for run in runs),
        "decode_tokens_per_s": timing.decode_tokens_per_s,
        "kv_reservation_tokens": max(
            (
                int(run.done.get("kv_reservation_tokens") or run.admitted.get("kv_reservation_tokens", 0))
                for run in runs
            ),
            default=0,
        ),
        "preemptions": sum(int(run.done.get("preemptions", 0)) for run in runs),
        "engine_requests": len(runs),
    }


def metrics_summary(job: Job) -> dict:
    metrics = getattr(job, "metrics", None)
    statements = None
    if job.kind == JobKind.SUMMARISE:
        sourced = SummaryResult.from_json(job.result_data).statements
        statements = None if sourced is None else [statement_to_json(s) for s in sourced]
    html = render_markdown(job.result_text)  # the page swaps the streamed text for this
    if metrics is None:
        return {"note": job.result_note, "statements": statements, "html": html}
    return {
        "note": job.result_note,
        "statements": statements,
        "html": html,
        "ttft_ms": round(metrics.ttft_ms, 1),
        "queue_wait_ms": round(metrics.queue_wait_ms, 1),
        "prompt_tokens": metrics.prompt_tokens,
        "output_tokens": metrics.output_tokens,
        "decode_tokens_per_s": round(metrics.decode_tokens_per_s, 1) if metrics.decode_tokens_per_s else None,
    }
