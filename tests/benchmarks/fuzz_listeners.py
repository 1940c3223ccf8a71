"""The listener fuzz properties with many examples, counting what every listener answered.

Run from the repository root::

    .venv/bin/python tests/benchmarks/fuzz_listeners.py --long     # 2,000 examples per listener
    .venv/bin/python tests/benchmarks/fuzz_listeners.py [--examples 200] [--listeners openai,ollama,comfyui]
                                                         [--seed N] [--json]

The same steward, requests and properties as ``tests/test_fuzz_listeners.py`` (its
docstring says what is checked and how an upstream's answer is told from steward's),
but nothing stops at a failure and nothing is shrunk: the regressions the tests try
first and then every drawn example are sent, judged and followed by the known-good
request. The run prints, per listener: how many examples it drew and how many distinct
ones it sent (Hypothesis draws many a request twice; it is sent once) and how long they
took; the statuses seen; who wrote the answers (``steward``, ``upstream``, ``upstream
broke``: a 502 for a fake that failed on the request, see rule 1); and every distinct
failure, with its kind and status, how many examples showed it, and the shortest of
them as a request to send again by hand. Failures are grouped by kind, status, the
answer's content type and first bytes, and how the path and the body were made
(``tests/fuzz_strategies.py``).

Without ``--seed`` the examples are the same on every run (``derandomize``); with it,
Hypothesis draws new ones from that seed. A listener whose steward died is not fuzzed
further. Exit status: 0 no failure, 1 some.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hypothesis import Phase, given, seed, settings  # noqa: E402

from tests.fuzz_strategies import FuzzRequest, regressions, requests  # noqa: E402
from tests.test_fuzz_listeners import (  # noqa: E402
    BODY_LIMIT,
    Answer,
    FuzzSteward,
    ListenerViolation,
    StewardDown,
    Verdict,
    exercise,
    fuzz_settings,
    open_fuzz_steward,
)

LONG_EXAMPLES = 2_000
DEFAULT_EXAMPLES = 200
LISTENERS = ("openai", "ollama", "comfyui")


def body_family(kind: str) -> str:
    """Bodies nested deep in a field or as a whole fail alike: one family."""
    return "deep" if kind.startswith("deep") else kind


@attrs.define
class Failure:
    """One distinct failure, with its examples counted by how they were made."""

    kind: str
    answer: str = ""  # what the shortest example got
    count: int = 0
    paths: Counter[str] = attrs.Factory(Counter)
    bodies: Counter[str] = attrs.Factory(Counter)
    shortest: dict[str, str] = attrs.Factory(dict)  # body family -> the shortest request that showed it

    def add(self, request: FuzzRequest, answer: str) -> None:
        self.count += 1
        family = body_family(request.body.kind)
        self.paths[request.path_kind] += 1
        self.bodies[family] += 1
        described = request.describe()
        if family not in self.shortest or len(described) < len(self.shortest[family]):
            self.shortest[family] = described
        if len(described) <= min(len(s) for s in self.shortest.values()):
            self.answer = answer


@attrs.define
class Tally:
    listener: str
    drawn: int = 0  # examples Hypothesis drew (and regressions)
    examples: int = 0  # distinct requests sent: a request drawn twice is sent once
    seconds: float = 0.0
    statuses: Counter[str] = attrs.Factory(Counter)
    origins: Counter[str] = attrs.Factory(Counter)
    failures: dict[str, Failure] = attrs.Factory(dict)
    broke: dict[str, Failure] = attrs.Factory(dict)  # 502s for a fake that failed: the fakes' defects
    steward_died: bool = False

    @property
    def failed_examples(self) -> int:
        return sum(f.count for f in self.failures.values())

    def record(self, request: FuzzRequest, answer: Answer, verdict: Verdict, down: ListenerViolation | None) -> None:
        self.examples += 1
        self.statuses["no answer" if answer.status is None else str(answer.status)] += 1
        self.origins[verdict.origin] += 1
        if verdict.origin == "upstream broke":
            key = f"{answer.status} for {request.route}"
            self.broke.setdefault(key, Failure("upstream broke")).add(request, answer.summary())
        for failure in (verdict.failure, down):
            if failure is not None:
                key = signature(answer, failure)
                detail = str(failure) if isinstance(failure, StewardDown) else answer.summary()
                self.failures.setdefault(key, Failure(type(failure).__name__)).add(request, detail)

    def as_json(self) -> dict[str, Any]:
        return {"listener": self.listener, "drawn": self.drawn, "examples": self.examples,
                "seconds": round(self.seconds, 1), "statuses": dict(self.statuses), "origins": dict(self.origins),
                "steward_died": self.steward_died,
                "failures": [{"signature": k, **attrs.asdict(v)} for k, v in self.failures.items()],
                "upstream_broke": [{"signature": k, **attrs.asdict(v)} for k, v in self.broke.items()]}


def signature(answer: Answer, failure: ListenerViolation) -> str:
    """What makes two failures the same one, as far as can be told from outside: the kind
    and the answer (status, content type, first bytes with the digits blanked)."""
    if isinstance(failure, StewardDown):
        return f"{type(failure).__name__}: {str(failure).split(' after ', 1)[0]}"
    head = re.sub(rb"\d+", b"#", answer.body[:60])
    return f"{type(failure).__name__}: {answer.status} [{answer.content_type or 'no content-type'}] {head!r}"


def fuzz_listener(fuzz: FuzzSteward, name: str, examples: int, seed_value: int | None) -> Tally:
    tally = Tally(name)
    listener = fuzz.listeners[name]

    sent: set[FuzzRequest] = set()

    def one(request: FuzzRequest) -> None:
        tally.drawn += 1
        if tally.steward_died or request in sent:
            return
        sent.add(request)
        answer, verdict, down = exercise(fuzz, name, request)
        tally.record(request, answer, verdict, down)
        if fuzz.steward.process.poll() is not None:
            tally.steward_died = True

    drawn = settings(fuzz_settings(examples), phases=(Phase.generate,), derandomize=seed_value is None)(
        given(request=requests(listener.routes, BODY_LIMIT))(one))
    if seed_value is not None:
        drawn = seed(seed_value)(drawn)
    started = time.monotonic()
    for request in regressions(name, BODY_LIMIT):  # what the tests try first, counted too
        one(request)
    drawn()
    tally.seconds = time.monotonic() - started
    return tally


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in counter.most_common())


def _print_group(key: str, failure: Failure) -> None:
    print(f"    [{failure.count:>4}] {key}")
    print(f"           paths: {_counts(failure.paths)}; bodies: {_counts(failure.bodies)}")
    for family, request in sorted(failure.shortest.items()):
        print(f"           e.g. ({family}) {request[:400]}")
    print(f"           -> {failure.answer[:300]}")


def print_report(tallies: list[Tally]) -> None:
    for tally in tallies:
        per = tally.seconds / tally.examples * 1000 if tally.examples else 0.0
        print(f"\n{tally.listener}: {tally.examples} distinct examples sent ({tally.drawn} drawn) in "
              f"{tally.seconds:.1f} s ({per:.0f} ms each)" + ("; STEWARD DIED" if tally.steward_died else ""))
        statuses = ", ".join(f"{s} x{n}" for s, n in sorted(tally.statuses.items()))
        print(f"  statuses: {statuses}")
        print(f"  answered by: {_counts(tally.origins)}")
        print(f"  failures: {len(tally.failures)} distinct, in {tally.failed_examples} examples")
        for key, failure in sorted(tally.failures.items(), key=lambda kv: -kv[1].count):
            _print_group(key, failure)
        if tally.broke:
            print(f"  a fake broke on the request (steward answered 502): {len(tally.broke)} routes")
            for key, failure in sorted(tally.broke.items(), key=lambda kv: -kv[1].count):
                _print_group(key, failure)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help=f"{LONG_EXAMPLES:,} examples per listener")
    parser.add_argument("--examples", type=int, default=None,
                        help=f"examples per listener (default {DEFAULT_EXAMPLES}, --long {LONG_EXAMPLES})")
    parser.add_argument("--listeners", default=",".join(LISTENERS), help="comma-separated, of " + ", ".join(LISTENERS))
    parser.add_argument("--seed", type=int, default=None, help="draw new examples from this seed")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the report")
    args = parser.parse_args(argv)
    args.listeners = [n.strip() for n in args.listeners.split(",") if n.strip()]
    unknown = set(args.listeners) - set(LISTENERS)
    if unknown:
        parser.error(f"unknown listeners: {', '.join(sorted(unknown))}")
    if args.examples is None:
        args.examples = LONG_EXAMPLES if args.long else DEFAULT_EXAMPLES
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tallies = []
    with tempfile.TemporaryDirectory(prefix="steward-fuzz-") as workdir, open_fuzz_steward(Path(workdir)) as fuzz:
        for name in args.listeners:
            if not args.json:
                print(f"fuzzing the {name} listener: {args.examples} examples ...", file=sys.stderr, flush=True)
            tallies.append(fuzz_listener(fuzz, name, args.examples, args.seed))
            if tallies[-1].steward_died:
                break
        # Reported before the steward stops: stopping one that died raises.
        if args.json:
            print(json.dumps({"examples_per_listener": args.examples, "seed": args.seed,
                              "listeners": [t.as_json() for t in tallies]}, indent=2))
        else:
            print_report(tallies)
    return 1 if any(t.failures or t.steward_died for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
