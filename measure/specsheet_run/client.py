"""HTTP as an internal tool speaks it: uploads, jobs, streamed chat completions, each timed."""

from __future__ import annotations

import contextlib
import json
import time

import httpx
from django.core.management.base import CommandError

from inference.specsheet import Sample
from inference.timing import Delta


class _TimedOut(Exception):
    pass


class _Client:
    def __init__(self, url: str, token: str, *, timeout_s: float) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout_s = timeout_s

    def _http(self):
        # A read timeout alone would never fire: a waiting job's stream sends something every few
        # seconds. Each request also has a deadline (``_lines``).
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=httpx.Timeout(60, connect=10))

    def model_id(self) -> str:
        with self._http() as http:
            response = http.get("/v1/models")
        _check(response, "GET /v1/models")
        return response.json()["data"][0]["id"]

    def upload(self, name: str, text: str) -> int:
        with self._http() as http:
            response = http.post("/api/v1/documents", files={"file": (name, text.encode(), "text/plain")})
        _check(response, "POST /api/v1/documents")
        return int(response.json()["id"])

    def document_states(self, ids: list[int]) -> dict[int, tuple[str, str]]:
        states = {}
        with self._http() as http:
            for document_id in ids:
                response = http.get(f"/api/v1/documents/{document_id}")
                _check(response, "GET /api/v1/documents/{id}")
                body = response.json()
                states[document_id] = (body["state"], body.get("error") or "")
        return states

    def _lines(self, stream, deadline: float):
        for line in stream.iter_lines():
            yield line
            if time.monotonic() > deadline:
                raise _TimedOut

    def _cancel(self, http, job_id: str | None) -> None:
        if job_id:
            with contextlib.suppress(httpx.HTTPError):  # the account's clean-up cancels it otherwise
                http.post(f"/api/v1/jobs/{job_id}/cancel")

    def summary(self, sample: Sample, *, document_id: int, max_tokens: int) -> None:
        """A summary job, then its stream: each ``delta`` carries its tokens' times at the worker."""
        deadline = time.monotonic() + self.timeout_s
        job_id = None
        with self._http() as http:
            try:
                response = http.post(
                    "/api/v1/jobs/summary",
                    json={"document_id": document_id, "length": "short", "max_tokens": max_tokens, "ignore_eos": True},
                )
                _check(response, "POST /api/v1/jobs/summary")
                job_id = response.json()["id"]
                with http.stream("GET", f"/api/v1/jobs/{job_id}/stream") as stream:
                    event = ""
                    for line in self._lines(stream, deadline):
                        if line.startswith("event: "):
                            event = line[7:]
                            continue
                        if not line.startswith("data: "):
                            continue
                        if event == "delta":
                            _add_tokens(sample, json.loads(line[6:]), time.time())
                        elif event == "restart":
                            _restarted(sample)
                        elif event in ("failed", "cancelled"):
                            detail = json.loads(line[6:]).get("detail") or "no reason given"
                            sample.error = f"the job {event}: {detail}"
                            return
                        elif event == "done":
                            sample.finished_at = time.time()
                            return
                sample.error = "the stream ended before the job did"
            except (_TimedOut, httpx.HTTPError) as exc:
                sample.error = _lost(exc, self.timeout_s)
                self._cancel(http, job_id)

    def chat(self, sample: Sample, *, model: str, prompt: str, max_tokens: int) -> None:
        """A streamed chat completion; with ``continuous_usage_stats`` each chunk carries the usage
        so far and its tokens' times at the worker."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        deadline = time.monotonic() + self.timeout_s
        written = 0
        with self._http() as http, http.stream("POST", "/v1/chat/completions", json=body) as stream:
            if stream.status_code != 200:
                stream.read()
                _check(stream, "POST /v1/chat/completions")
            try:
                for line in self._lines(stream, deadline):
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        sample.finished_at = time.time()
                        return
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        sample.error = str(chunk["error"].get("message") or chunk["error"])
                        return
                    written = _chat_chunk(sample, chunk, written, time.time())
                sample.error = "the stream ended without [DONE]"
            except (_TimedOut, httpx.HTTPError) as exc:
                sample.error = _lost(exc, self.timeout_s)
                self._cancel(http, stream.headers.get("X-Appliance-Job-Id"))


def _lost(exc: Exception, timeout_s: float) -> str:
    """Why a request's stream was given up (its job is cancelled)."""
    if isinstance(exc, _TimedOut):
        return f"no answer within {timeout_s:.0f} s (--request-timeout); its job was cancelled"
    return f"the stream broke ({type(exc).__name__}: {exc}); its job was cancelled"


def _add_tokens(sample: Sample, data: dict, arrived: float) -> None:
    """A delta of a stream: its tokens at the times the worker received them."""
    times = [Delta(at=float(at), tokens=int(n)) for at, n in data.get("times") or () if int(n) > 0]
    if not times and int(data.get("tokens") or 0) > 0:  # a stream that does not say: the client's clock
        times = [Delta(at=arrived, tokens=int(data["tokens"]))]
    if times and sample.first_token_at is None:
        sample.first_token_at = arrived
    sample.deltas.extend(times)
    sample.prompt_tokens = data.get("prompt_tokens") or sample.prompt_tokens


def _chat_chunk(sample: Sample, chunk: dict, written: int, arrived: float) -> int:
    """A chat completion chunk with ``continuous_usage_stats``: its tokens go to ``sample``.
    Returns the tokens written so far."""
    usage = chunk.get("usage") or {}
    if not chunk.get("choices") or usage.get("completion_tokens") is None:
        return written
    times = (chunk.get("appliance") or {}).get("token_times")
    new = sum(n for _, n in times) if times is not None else usage["completion_tokens"] - written
    # The appliance started the request again: its count starts anew, and chunks resume once the
    # new attempt has caught up with the text already sent, carrying all of its tokens' times.
    if times is not None and usage["completion_tokens"] != written + new:
        _restarted(sample)
    _add_tokens(sample, {"tokens": new, "times": times or (), "prompt_tokens": usage.get("prompt_tokens")}, arrived)
    return usage["completion_tokens"]


def _restarted(sample: Sample) -> None:
    """The appliance lost the worker or the engine and runs the request again from the start: its
    tokens are counted anew (the first token the user saw stays the first)."""
    sample.restarts += 1
    sample.deltas.clear()


def _check(response, what: str) -> None:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text[:200]
        raise CommandError(f"{what} answered {response.status_code}: {detail}")
