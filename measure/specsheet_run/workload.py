"""The workload: each profile's ladder of concurrent users, level by level, until a target is missed."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from inference import specsheet as sheet_
from inference.prompts import section_messages
from inference.specsheet import Sample
from inference.summarise import section_budget_tokens
from measure.benchmarking import (
    Progress,
    synthetic_rng,
    synthetic_sentence,
)
from measure.specsheet_run.client import _Client
from measure.specsheet_run.plan import _Plan

DRAFTING_INSTRUCTION = "Draft a reply to this letter.\n\n"


PROFILE_TEXT = {
    "document": ("Document", "long input, short output: a summary job on the prefill queue"),
    "drafting": ("Drafting", "short input, long output: a streamed chat completion on the decode queue"),
    "mixed": ("Mixed", "half the users summarise documents while the other half draft, at once"),
}


class _Workload:
    def __init__(self, client: _Client, progress: Progress, plan: _Plan, engine: dict, *, seed: int) -> None:
        from transformers import AutoTokenizer

        self.client, self.progress, self.plan, self.engine = client, progress, plan, engine
        self.rng = synthetic_rng(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(engine.get("model_path") or settings.APPLIANCE_MODEL)
        self.model = client.model_id()
        self.counter = 0
        # What the chat template and the instruction add around a drafting request's letter, so
        # that the whole prompt has the input length asked for.
        self.drafting_overhead = max(
            0, self._prompt_tokens([{"role": "user", "content": f"{DRAFTING_INSTRUCTION}x"}]) - 1
        )
        context = int(engine["max_model_len"])
        # A document must be one summary request (a longer one is summarised part by part, and
        # its TTFT would be the last part's): at most what a section of the context holds, and its
        # text cut as the appliance will cut it (pages, page marks, title) must make one section.
        try:
            self.document_input = min(plan.document_input, section_budget_tokens(context))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.document_text_tokens = self._one_section_tokens(context)
        self.drafting_input = min(plan.drafting_input, context - plan.drafting_output - 64)
        if self.drafting_input < 1:
            raise CommandError(f"--drafting-output {plan.drafting_output} leaves no room in a {context}-token context")
        # The engine host's admission budget; documents may not use the share kept for drafting.
        budget = engine.get("kv_budget_tokens") or int(
            engine["kv_capacity_tokens"] * float(engine.get("kv_safety_factor", 1.0))
        )
        reserve = engine.get("kv_decode_reserve_tokens")
        if reserve is None:
            reserve = int(budget * float(engine.get("kv_decode_reserve_fraction", 0.0)))
        self.kv_budget, self.kv_decode_reserve = int(budget), int(reserve)

    # text

    def _one_section_tokens(self, context: int) -> int:
        """Tokens of document text that the appliance summarises in one request: the most, up to
        ``document_input`` in all, whose pages the appliance's own ``split_sections`` keeps in one
        section (a little less for the next document's other sentences)."""
        from documents.extraction import paginate
        from inference.prompts import PageText
        from inference.summarise import split_sections

        def count_many(prompts: list) -> list[int]:
            return [self._prompt_tokens(messages) for messages in prompts]

        tokens = self.document_input
        for _ in range(12):
            text = self._text(tokens)
            pages = [PageText(i + 1, page) for i, page in enumerate(paginate(text))]
            sections = split_sections(title="specsheet-0", pages=pages, context_tokens=context, count_many=count_many)
            if len(sections) == 1:
                whole = count_many([section_messages(title="specsheet-0", pages=pages, instruction="")])[0]
                if whole <= self.document_input:
                    return int(tokens * 0.98)
            tokens = int(tokens * 0.95)
        raise CommandError(f"no document fits one summary request in a {context}-token context")

    def _prompt_tokens(self, messages: list[dict]) -> int:
        """Tokens of a chat prompt as the engine host counts them: the chat template, then the text."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str)  # tokenize=False: the prompt's text
        return self._count(text)

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _text(self, tokens: int) -> str:
        """New contract-like text of ``tokens`` tokens, give or take half a sentence, with a unique
        opening line, so that no two requests share a prefix in the cache."""
        self.counter += 1
        sentences = [f"Agreement {self.counter}-{self.rng.randrange(10**9)}."]
        count = self._count(sentences[0])
        while count < tokens:
            sentence = synthetic_sentence(self.rng)
            count += self._count(" " + sentence)
            sentences.append(sentence)
        text, shorter = " ".join(sentences), " ".join(sentences[:-1])
        if len(sentences) > 1 and abs(self._count(shorter) - tokens) < abs(self._count(text) - tokens):
            return shorter
        return text

    def _documents(self, n: int) -> list[int]:
        """``n`` new documents uploaded through the API, once they are ready to summarise."""
        if n == 0:
            return []
        self.progress(f"uploading {n} document(s) of {self.document_text_tokens:,} tokens of text")
        ids = [
            self.client.upload(f"specsheet-{self.counter + 1}.txt", self._text(self.document_text_tokens))
            for _ in range(n)
        ]
        deadline = time.monotonic() + 600
        while True:
            states = self.client.document_states(ids)
            failed = {i: error for i, (state, error) in states.items() if state == "failed"}
            if failed:
                raise CommandError(f"a document failed to ingest: {next(iter(failed.values()))}")
            if all(state == "ready" for state, _ in states.values()):
                return ids
            if time.monotonic() > deadline:
                raise CommandError("documents were not ready after 10 minutes; is the ingest worker running?")
            time.sleep(0.5)

    # one profile

    def _levels(self) -> list[int]:
        if self.plan.levels:
            return self.plan.levels
        top = self.plan.max_concurrency
        if not top:
            seqs = self.engine.get("max_num_seqs") or settings.APPLIANCE_MAX_NUM_SEQS
            if seqs is None:
                raise CommandError("the engine did not say how many requests it runs at once: give --max-concurrency")
            top = int(seqs)
        return sheet_.ladder(top)

    def _kinds(self, name: str, users: int) -> list[str]:
        if name == "mixed":
            return ["document" if i % 2 else "drafting" for i in range(users)]
        return [name] * users

    def _kv_shortfall(self, kinds: list[str]) -> str | None:
        return sheet_.kv_shortfall(
            requests={kind: kinds.count(kind) for kind in set(kinds)},
            tokens_per_request={
                "document": self.document_input + self.plan.document_output,
                "drafting": self.drafting_input + self.plan.drafting_output,
            },
            in_flight_cap={
                "document": settings.APPLIANCE_PREFILL_CONCURRENCY,
                "drafting": settings.APPLIANCE_DECODE_CONCURRENCY,
            },
            budget_tokens=self.kv_budget,
            document_budget_tokens=self.kv_budget - self.kv_decode_reserve,
        )

    def profile(self, name: str) -> dict[str, Any]:
        label, description = PROFILE_TEXT[name]
        levels = [level for level in self._levels() if name != "mixed" or level >= 2]
        rows: list[dict[str, Any]] = []
        stopped = error = ""
        explicit = bool(self.plan.levels)
        for users in levels:
            kinds = self._kinds(name, users)
            shortfall = self._kv_shortfall(kinds)
            if shortfall and not explicit:
                stopped = f"the KV budget at {sheet_._users(users)}: {shortfall}"
                break
            if self.plan.deadline is not None and time.monotonic() > self.plan.deadline:
                stopped = "the time budget (--max-minutes) ran out"
                break
            try:
                row = self._level(name, kinds)
            except CommandError as exc:  # the appliance refused to set the level up: say so, go on
                error = str(exc)
                stopped = f"an error at {sheet_._users(users)}: {exc}"
                self.progress(f"{label.lower()} x {users}: {exc}")
                break
            rows.append(row)
            self.progress(f"{label.lower()} x {users}: {_level_line(row)}")
            if not row["meets_target"] and not explicit:
                stopped = (
                    f"the latency target: goodput {row['goodput']:.0%} < {self.plan.targets.min_goodput:.0%} "
                    f"at {sheet_._users(users)}"
                )
                break
        else:
            ran = ", ".join(str(level) for level in levels)
            stopped = f"the top of the ladder ({ran})" if not explicit else f"running only the levels asked for ({ran})"
        inputs = {"document": self.document_input, "drafting": self.drafting_input}
        outputs = {"document": self.plan.document_output, "drafting": self.plan.drafting_output}
        kinds = ["document", "drafting"] if name == "mixed" else [name]
        return {
            "label": label,
            "description": description,
            "queue": {"document": "prefill", "drafting": "decode", "mixed": "prefill + decode"}[name],
            # The mixed profile has two kinds of request: see ``inputs`` and ``outputs``.
            "input_tokens": inputs[name] if name != "mixed" else None,
            "output_tokens": outputs[name] if name != "mixed" else None,
            "inputs": {k: inputs[k] for k in kinds},
            "outputs": {k: outputs[k] for k in kinds},
            "requests_per_user": self.plan.requests_per_user,
            "levels": rows,
            "users_served": sheet_.users_served(rows),
            "stopped": stopped,
            "error": error,
        }

    def _level(self, name: str, kinds: list[str]) -> dict[str, Any]:
        per_user = self.plan.requests_per_user
        documents = iter(self._documents(kinds.count("document") * per_user))
        prompts = {
            i: [
                f"{DRAFTING_INSTRUCTION}{self._text(max(1, self.drafting_input - self.drafting_overhead))}"
                for _ in range(per_user)
            ]
            for i, kind in enumerate(kinds)
            if kind == "drafting"
        }
        work: dict[int, list[int] | list[str]] = {
            i: [next(documents) for _ in range(per_user)] if kind == "document" else prompts[i]
            for i, kind in enumerate(kinds)
        }
        samples: list[Sample] = []
        lock = threading.Lock()
        gate = threading.Barrier(len(kinds))

        def user(i: int) -> None:
            gate.wait()
            for item in work[i]:
                sample = Sample(kind=kinds[i], sent_at=time.time())
                try:
                    if isinstance(item, int):  # a document's id
                        self.client.summary(sample, document_id=item, max_tokens=self.plan.document_output)
                    else:
                        self.client.chat(sample, model=self.model, prompt=item, max_tokens=self.plan.drafting_output)
                except Exception as exc:  # noqa: BLE001 -- a failed request is a figure of the sheet
                    sample.error = sample.error or f"{type(exc).__name__}: {exc}"
                with lock:
                    samples.append(sample)

        # Daemon threads, joined with a timeout: Ctrl-C reaches this thread, and the command's
        # clean-up cancels what they asked for.
        threads = [
            threading.Thread(target=user, args=(i,), name=f"specsheet-user-{i}", daemon=True) for i in range(len(kinds))
        ]
        started = time.time()
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
        wall = max((s.finished_at or time.time()) for s in samples) - started
        row = sheet_.summarise_level(samples, concurrency=len(kinds), wall_s=wall, targets=self.plan.targets)
        if name == "mixed":
            row["by_kind"] = {
                kind: sheet_.summarise_level(
                    [s for s in samples if s.kind == kind],
                    concurrency=kinds.count(kind),
                    wall_s=wall,
                    targets=self.plan.targets,
                )
                for kind in ("document", "drafting")
            }
        return row


def _level_line(row: dict) -> str:
    return (
        f"TTFT p50 {sheet_._seconds(row['ttft_p50_ms'])} p95 {sheet_._seconds(row['ttft_p95_ms'])}, "
        f"ITL p50 {row['itl_p50_ms']} ms p95 {row['itl_p95_ms']} ms, "
        f"{row['tokens_per_s_per_user']} tokens/s per user, {row['aggregate_tokens_per_s']} aggregate, "
        f"goodput {row['goodput']:.0%}" + (f", {row['failed']} failed" if row["failed"] else "")
    )
