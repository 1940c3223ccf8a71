"""The listener fuzz properties with many requests, counting what every listener was sent and answered.

Run from the repository root::

    .venv/bin/python tests/benchmarks/fuzz_listeners.py --long     # 3,000 distinct requests per listener
    .venv/bin/python tests/benchmarks/fuzz_listeners.py [--requests 200] [--listeners openai,ollama,comfyui]
                                                         [--keys both|off|on] [--seed N] [--json]

The same steward, requests and properties as ``tests/test_fuzz_listeners.py`` (its
docstring says what is checked and how an upstream's answer is told from steward's),
but nothing stops at a failure and nothing is shrunk. Each listener gets ``--requests``
distinct requests, half with no keys and half with the fuzz keys in force (``--keys``:
both, or one of the two for all of them): first the regressions the tests try, then
what Hypothesis draws, in rounds of up to 1,000 examples from seeds N, N+1, ... until
enough distinct requests were sent (Hypothesis draws many a request twice; it is sent
once). Each is judged and followed by the known-good request.

The run prints, per listener: how many distinct requests it sent, with keys off and on,
how many it drew, and how long they took; the statuses seen; who wrote the answers
(``steward``, ``upstream``, ``upstream broke``: a 502 for a fake that failed on the
request, see rule 1); how many requests carried each class of input (``body:`` how the
body was made, ``path:`` how the path was, ``key:`` how the key was shown, ``hostile:``
which class of hostile string, ``hostile-in:`` where it went, ``method:other``,
``framing:chunked``; a request counts under each class it carries); and every distinct
failure, with its kind and status, how many requests showed it, and the shortest of them
as a request to send again by hand. Failures are grouped by kind, status, the answer's
content type and first bytes, and how the path and the body were made
(``tests/fuzz_strategies.py``).

Without ``--seed`` the requests are the same on every run (seeds 0, 1, ...). A listener
whose steward died is not fuzzed further. Exit status: 0 no failure, 1 some.
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
import httpcore

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hypothesis import Phase, given, seed, settings  # noqa: E402

from tests.fuzz_strategies import (  # noqa: E402
    FuzzRequest,
    keyed_regressions,
    keyed_requests,
    regressions,
    requests,
)
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

LONG_REQUESTS = 3_000
DEFAULT_REQUESTS = 200
ROUND_EXAMPLES = 1_000  # examples Hypothesis draws per seed
MAX_ROUNDS = 50  # seeds tried before a phase gives up on its count (never reached in practice)
LISTENERS = ("openai", "ollama", "comfyui")
KEY_MODES = {"both": (False, True), "off": (False,), "on": (True,)}


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

    def add(self, request: FuzzRequest, answer: str, keys: bool) -> None:
        self.count += 1
        family = body_family(request.body.kind)
        self.paths[request.path_kind] += 1
        self.bodies[family] += 1
        described = ("(keys on) " if keys else "(keys off) ") + request.describe()
        if family not in self.shortest or len(described) < len(self.shortest[family]):
            self.shortest[family] = described
        if len(described) <= min(len(s) for s in self.shortest.values()):
            self.answer = answer


@attrs.define
class Tally:
    listener: str
    drawn: int = 0  # examples Hypothesis drew (and regressions)
    sent: dict[bool, set[FuzzRequest]] = attrs.Factory(lambda: {False: set(), True: set()})  # by keys on
    seconds: float = 0.0
    statuses: Counter[str] = attrs.Factory(Counter)
    origins: Counter[str] = attrs.Factory(Counter)
    classes: Counter[str] = attrs.Factory(Counter)  # requests that carried each class of input
    failures: dict[str, Failure] = attrs.Factory(dict)
    broke: dict[str, Failure] = attrs.Factory(dict)  # 502s for a fake that failed: the fakes' defects
    unsendable: list[str] = attrs.Factory(list)  # requests h11 refused to send: the strategies' defects
    steward_died: bool = False

    @property
    def examples(self) -> int:
        """Distinct requests sent (a request sent with keys off and again with keys on counts twice)."""
        return len(self.sent[False]) + len(self.sent[True])

    @property
    def failed_examples(self) -> int:
        return sum(f.count for f in self.failures.values())

    def record(self, request: FuzzRequest, keys: bool, answer: Answer, verdict: Verdict,
               down: ListenerViolation | None) -> None:
        self.statuses["no answer" if answer.status is None else str(answer.status)] += 1
        self.origins[verdict.origin] += 1
        self.classes.update((f"keys:{'on' if keys else 'off'}", *request.input_classes()))
        if verdict.origin == "upstream broke":
            key = f"{answer.status} for {request.route}"
            self.broke.setdefault(key, Failure("upstream broke")).add(request, answer.summary(), keys)
        for failure in (verdict.failure, down):
            if failure is not None:
                key = signature(answer, failure)
                detail = str(failure) if isinstance(failure, StewardDown) else answer.summary()
                self.failures.setdefault(key, Failure(type(failure).__name__)).add(request, detail, keys)

    def as_json(self) -> dict[str, Any]:
        return {"listener": self.listener, "drawn": self.drawn, "examples": self.examples,
                "keys_off": len(self.sent[False]), "keys_on": len(self.sent[True]),
                "seconds": round(self.seconds, 1), "statuses": dict(self.statuses), "origins": dict(self.origins),
                "classes": dict(sorted(self.classes.items())), "steward_died": self.steward_died,
                "unsendable": self.unsendable,
                "failures": [{"signature": k, **attrs.asdict(v)} for k, v in self.failures.items()],
                "upstream_broke": [{"signature": k, **attrs.asdict(v)} for k, v in self.broke.items()]}


def signature(answer: Answer, failure: ListenerViolation) -> str:
    """What makes two failures the same one, as far as can be told from outside: the kind
    and the answer (status, content type, first bytes with the digits blanked)."""
    if isinstance(failure, StewardDown):
        return f"{type(failure).__name__}: {str(failure).split(' after ', 1)[0]}"
    head = re.sub(rb"\d+", b"#", answer.body[:60])
    return f"{type(failure).__name__}: {answer.status} [{answer.content_type or 'no content-type'}] {head!r}"


def fuzz_phase(fuzz: FuzzSteward, tally: Tally, keys: bool, count: int, first_seed: int) -> None:
    """Send *count* distinct requests to the listener with keys on or off: its regressions, then
    what Hypothesis draws from seeds *first_seed*, *first_seed* + 1, ... until there are enough."""
    name = tally.listener
    listener = fuzz.listeners[name]
    fuzz.use_keys(keys)
    sent = tally.sent[keys]

    def one(request: FuzzRequest) -> None:
        tally.drawn += 1
        if tally.steward_died or len(sent) >= count or request in sent:
            return
        sent.add(request)
        try:
            answer, verdict, down = exercise(fuzz, name, request)
        except httpcore.LocalProtocolError as exc:  # the test raises it; a long run notes it and goes on
            tally.unsendable.append(f"{exc}: {request.describe()[:300]}")
            return
        tally.record(request, keys, answer, verdict, down)
        if fuzz.steward.process.poll() is not None:
            tally.steward_died = True

    for request in (keyed_regressions if keys else regressions)(name, BODY_LIMIT):  # what the tests try first
        one(request)
    strategy = keyed_requests(listener.routes, BODY_LIMIT) if keys else requests(listener.routes, BODY_LIMIT)
    for round_ in range(MAX_ROUNDS):
        if len(sent) >= count or tally.steward_died:
            return
        examples = min(ROUND_EXAMPLES, 2 * (count - len(sent)) + 20)
        drawn = settings(fuzz_settings(examples), phases=(Phase.generate,), derandomize=False)(
            given(request=strategy)(one))
        seed(first_seed + round_)(drawn)()


def fuzz_listener(fuzz: FuzzSteward, name: str, count: int, modes: tuple[bool, ...], first_seed: int) -> Tally:
    tally = Tally(name)
    started = time.monotonic()
    for i, keys in enumerate(modes):
        share = count // len(modes) + (1 if i < count % len(modes) else 0)
        fuzz_phase(fuzz, tally, keys, share, first_seed)
        if tally.steward_died:
            break
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


def _print_classes(classes: Counter[str]) -> None:
    """The classes of input, one line per dimension, most common first."""
    dimensions: dict[str, Counter[str]] = {}
    for name, n in classes.items():
        dimension, _, kind = name.partition(":")
        dimensions.setdefault(dimension, Counter())[kind] = n
    for dimension in sorted(dimensions):
        print(f"    {dimension}: {_counts(dimensions[dimension])}")


def print_report(tallies: list[Tally]) -> None:
    for tally in tallies:
        per = tally.seconds / tally.examples * 1000 if tally.examples else 0.0
        print(f"\n{tally.listener}: {tally.examples} distinct requests sent ({len(tally.sent[False])} keys off, "
              f"{len(tally.sent[True])} keys on; {tally.drawn} drawn) in {tally.seconds:.1f} s ({per:.0f} ms each)"
              + ("; STEWARD DIED" if tally.steward_died else ""))
        statuses = ", ".join(f"{s} x{n}" for s, n in sorted(tally.statuses.items()))
        print(f"  statuses: {statuses}")
        print(f"  answered by: {_counts(tally.origins)}")
        print("  requests per class of input:")
        _print_classes(tally.classes)
        print(f"  failures: {len(tally.failures)} distinct, in {tally.failed_examples} requests")
        for key, failure in sorted(tally.failures.items(), key=lambda kv: -kv[1].count):
            _print_group(key, failure)
        if tally.unsendable:
            print(f"  requests the client refused to send (a strategy's defect): {len(tally.unsendable)}")
            for line in tally.unsendable[:5]:
                print(f"    {line[:400]}")
        if tally.broke:
            print(f"  a fake broke on the request (steward answered 502): {len(tally.broke)} routes")
            for key, failure in sorted(tally.broke.items(), key=lambda kv: -kv[1].count):
                _print_group(key, failure)
    total = sum(t.examples for t in tallies)
    hostile = sum(t.classes["hostile:any"] for t in tallies)
    print(f"\nin all: {total} distinct requests, {hostile} with a hostile string; "
          f"{sum(len(t.failures) for t in tallies)} distinct failures")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help=f"{LONG_REQUESTS:,} distinct requests per listener")
    parser.add_argument("--requests", type=int, default=None,
                        help=f"distinct requests per listener, keys off and on together (default {DEFAULT_REQUESTS}, "
                             f"--long {LONG_REQUESTS})")
    parser.add_argument("--listeners", default=",".join(LISTENERS), help="comma-separated, of " + ", ".join(LISTENERS))
    parser.add_argument("--keys", choices=sorted(KEY_MODES), default="both",
                        help="with no keys, with the fuzz keys in force, or half and half (default)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed Hypothesis draws from (default 0)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the report")
    args = parser.parse_args(argv)
    args.listeners = [n.strip() for n in args.listeners.split(",") if n.strip()]
    unknown = set(args.listeners) - set(LISTENERS)
    if unknown:
        parser.error(f"unknown listeners: {', '.join(sorted(unknown))}")
    if args.requests is None:
        args.requests = LONG_REQUESTS if args.long else DEFAULT_REQUESTS
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tallies = []
    with tempfile.TemporaryDirectory(prefix="steward-fuzz-") as workdir, open_fuzz_steward(Path(workdir)) as fuzz:
        for name in args.listeners:
            if not args.json:
                print(f"fuzzing the {name} listener: {args.requests} distinct requests, keys {args.keys} ...",
                      file=sys.stderr, flush=True)
            tallies.append(fuzz_listener(fuzz, name, args.requests, KEY_MODES[args.keys], args.seed))
            if tallies[-1].steward_died:
                break
        # Reported before the steward stops: stopping one that died raises.
        if args.json:
            print(json.dumps({"requests_per_listener": args.requests, "keys": args.keys, "seed": args.seed,
                              "listeners": [t.as_json() for t in tallies]}, indent=2))
        else:
            print_report(tallies)
    return 1 if any(t.failures or t.steward_died or t.unsendable for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
