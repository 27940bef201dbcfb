"""What to run: the profiles, their lengths scaled to the model's context, the ladder of users."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.core.management.base import CommandError

from inference.specsheet import PROFILES, Targets


@dataclass
class _Plan:
    quick: bool
    profiles: list[str]
    levels: list[int] | None  # None: the ladder of users from the engine's capacity
    max_concurrency: int | None
    requests_per_user: int
    document_input: int
    document_output: int
    drafting_input: int
    drafting_output: int
    targets: Targets
    budget_s: float
    deadline: float | None = None  # set when the clock starts

    @classmethod
    def from_options(cls, options: dict) -> _Plan:
        quick = options["quick"]
        profiles = [p.strip() for p in options["profiles"].split(",") if p.strip()]
        if not profiles or any(p not in PROFILES for p in profiles):
            raise CommandError(f"--profiles: choose from {', '.join(PROFILES)}")
        levels = None
        if options["levels"]:
            try:
                levels = sorted({int(v) for v in options["levels"].split(",") if v.strip()})
            except ValueError:
                raise CommandError("--levels: whole numbers separated by commas, e.g. 1,2,4") from None
            if not levels or levels[0] < 1:
                raise CommandError("--levels: each level is at least 1")
        elif quick:
            levels = [1, 2]
        targets = Targets(
            ttft_ms=options["ttft_target_s"] * 1000, itl_ms=options["itl_target_ms"], min_goodput=options["min_goodput"]
        )
        if not 0 < targets.min_goodput <= 1 or targets.ttft_ms <= 0 or targets.itl_ms <= 0:
            raise CommandError("the targets must be positive and --min-goodput between 0 and 1")

        def positive(name: str, value):
            if value <= 0:
                raise CommandError(f"--{name.replace('_', '-')} must be more than 0")
            return value

        def tokens(name: str, default: int, quick_default: int) -> int:
            return positive(name, options[name] if options[name] is not None else (quick_default if quick else default))

        for name in ("request_timeout", "max_minutes", "memory_bandwidth_gbs"):
            if options[name] is not None:
                positive(name, options[name])

        return cls(
            quick=quick,
            profiles=profiles,
            levels=levels,
            max_concurrency=None
            if options["max_concurrency"] is None
            else positive("max_concurrency", options["max_concurrency"]),
            requests_per_user=positive(
                "requests_per_user",
                options["requests_per_user"] if options["requests_per_user"] is not None else (1 if quick else 2),
            ),
            document_input=tokens("document_input", 8000, 1024),
            document_output=min(tokens("document_output", 256, 32), settings.APPLIANCE_SUMMARY_MAX_TOKENS),
            drafting_input=tokens("drafting_input", 500, 128),
            drafting_output=tokens("drafting_output", 500, 64),
            targets=targets,
            budget_s=60 * (options["max_minutes"] or (10 if quick else 90)),
        )

    def start_clock(self) -> None:
        """The time budget counts from when the appliance answers (starting it is not measuring)."""
        self.deadline = time.monotonic() + self.budget_s
