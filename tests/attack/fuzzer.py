"""The fuzz loop: inputs from the mutator, played ``jobs`` at a time against one real
``rdc serve``, in batches. While a batch runs its memory and descriptors are sampled; after
it, once its connections closed, the oracle's checks run (the log, descriptors and memory
against the baseline, a fresh client, the canary tree) and the share is reset.

Each distinct finding (by `tests.attack.oracle.signature`) is saved once, with the inputs
that showed it, under the results directory: ``finding.txt`` says what and how to
reproduce it, ``input-N.bin`` is the input itself (`tests.attack.inputs.load`).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
import traceback
from collections.abc import Callable

from tests.attack.capture import Captured
from tests.attack.directed import directed
from tests.attack.inputs import Input, dump, dump_sessions
from tests.attack.mutate import LEVELS, generate
from tests.attack.oracle import (
    FLOODS,
    LogWatch,
    Record,
    probe,
    signature,
    suspicious,
)
from tests.attack.play import Player, Sources
from tests.attack.report import MIB, Finding, Report, Settings
from tests.attack.world import (
    World,
    busy,
    cpu_seconds,
    descriptor_kind,
    descriptor_targets,
    memory_kib,
)
from tests.e2e_support import tree_diff

SETTLE_SECONDS = 10.0  # of the server idle, for it to close every connection of a batch
SETTLE_BUSY_SECONDS = 120.0  # in all, while it is still at work on what a batch asked
STEADY_SECONDS = 0.5  # descriptors unchanged this long: settled (a leak, if above baseline)
LOG_ROTATE = 256 << 20  # bytes of log read and emptied even while a batch runs
LOG_FLOOD = 64 << 20  # bytes of log in one batch: a finding (a client can fill the disk)
HELD_RECORDS = 2000  # suspicious records kept between two checks
TREND_BATCHES = 4  # batches whose lowest RSS after says whether memory keeps growing
REFERENCE = 10_000_000  # input indices of the unmutated reference sessions


def index_of(address: str) -> int | None:
    """The input behind a connection from ``address`` (`tests.attack.play.address`)."""
    parts = address.split(".")
    if len(parts) != 4 or parts[0] != "127" or int(parts[1]) < 16:
        return None
    return (((int(parts[1]) - 16) << 16) | (int(parts[2]) << 8) | int(parts[3])) // 2


class Fuzzer:
    def __init__(self, world: World, captured: Captured, settings: Settings) -> None:
        assert world.daemon is not None
        self.world = world
        self.sessions = captured.sessions
        self.settings = settings
        self.player = Player(world.port, world.canary.leaks(), Sources(captured.contents))
        self.log = LogWatch(world.daemon.log_path)
        self.log.offset = world.log_checked
        self.report = Report()
        self.inputs: dict[int, Input] = {}  # given inputs (a replay), else generated
        self.baseline_fds: list[str] = []
        self.canary = world.outside_now()
        self.held: list[Record] = []  # suspicious records read while a batch ran
        self.stop = threading.Event()  # set (by a signal handler): end after this batch
        self.warming = False  # the reference runs: no memory or descriptor checks yet
        self.after: list[int] = []  # RSS (KiB) after each batch, once connections closed
        self._lock = threading.Lock()
        self.results = settings.results
        if self.results is not None:
            self.results.mkdir(parents=True, exist_ok=True)
            dump_sessions(self.sessions, self.results / "sessions.bin")

    def say(self, text: str) -> None:
        if self.settings.progress is not None:
            self.settings.progress(text)

    # ------------------------------------------------------------ the run

    def run(self, indices: list[int] | None = None) -> Report:
        """Play the inputs (``indices``, default 0 .. inputs-1) and check after each batch."""
        self._suspicious(self.log.poll(), [], "the captures (real clients)")
        self._baseline()
        if self.settings.reference:
            self._reference()
        if self.settings.directed:
            self._directed()
        todo = list(range(self.settings.inputs)) if indices is None else indices
        started = time.monotonic()
        for first in range(0, len(todo), self.settings.batch):
            if self.stop.is_set():
                self.say("stopped")
                break
            batch = todo[first : first + self.settings.batch]
            assert self.world.daemon is not None
            server, client = cpu_seconds(self.world.daemon.pid), time.process_time()
            logged = self.log.read
            self._batch(batch)
            self.report.server_cpu += cpu_seconds(self.world.daemon.pid) - server
            self.report.client_cpu += time.process_time() - client
            self._after(batch)
            logged = self.log.read - logged
            if logged > LOG_FLOOD:
                self.found("log", f"the server wrote more than {LOG_FLOOD >> 20} MB of log in "
                           "one batch", f"{logged >> 20} MB of log for {len(batch)} inputs",
                           [self.input(i) for i in batch[:3]])
            self.report.seconds = time.monotonic() - started
            self.say(f"{self.report.inputs:,} inputs, {self.report.rate:.0f}/s, "
                     f"{len(self.report.findings)} findings")
        self.report.seconds = time.monotonic() - started
        if self.settings.floods and not self.stop.is_set():
            self._floods()
        self._suspicious(self.log.poll(final=True), [], "the end of the run")
        self.world.log_checked = self.log.offset
        self._write_summary()
        return self.report

    def _reference(self) -> None:
        """Captured sessions played as they are (indices from REFERENCE on): their rate is
        what the fuzz rate is compared with, they must find nothing, and they warm the
        server up: the baseline of descriptors and memory is taken after them (a server
        that has served real clients holds caches, zstd contexts and malloc arenas that
        are no leak: ~250 MiB with 8 clients at once, level-19 contexts of ~18 MiB)."""
        batch = list(range(REFERENCE, REFERENCE + self.settings.reference))
        levels, self.settings.levels = self.settings.levels, ("replay",)
        started = time.monotonic()
        self.warming = True
        self._batch(batch)
        self.report.reference_rate = len(batch) / (time.monotonic() - started)
        self._after(batch)
        self.warming = False
        self.settings.levels = levels
        self.report.inputs = 0
        self._baseline()
        self.say(f"reference: {len(batch)} unmutated sessions, "
                 f"{self.report.reference_rate:.0f}/s")

    def _directed(self) -> None:
        """The hand-written attacks (`tests.attack.directed`), each checked on its own."""
        inputs = directed(self.settings.seed, self.world)
        self.inputs.update({inp.index: inp for inp in inputs})
        for inp in inputs:
            self._batch([inp.index])
            self._after([inp.index])
        self.report.inputs = 0
        # One connection at a time leaves less behind than ``jobs`` at once: the trend
        # of RSS compares the fuzz batches with each other, not with these.
        self.after.clear()
        self.say(f"directed: {len(inputs)} hand-written attacks played")

    def input(self, index: int) -> Input:
        given = self.inputs.get(index)
        if given is not None:
            return given
        return generate(self.settings.seed, index, self.sessions, self.settings.levels)

    def _baseline(self) -> None:
        assert self.world.daemon is not None
        self._settle()
        self.baseline_fds = descriptor_targets(self.world.daemon.pid)
        self.report.fds_base = len(self.baseline_fds)
        self.report.fds_max = max(self.report.fds_max, self.report.fds_base)
        self.report.rss_base = memory_kib(self.world.daemon.pid)[0]

    def _batch(self, batch: list[int]) -> None:
        pending = iter(batch)
        inflight: dict[int, Input] = {}
        done = threading.Event()

        def work() -> None:
            while not self.stop.is_set():
                with self._lock:
                    index = next(pending, None)
                if index is None:
                    return
                try:
                    inp = self.input(index)
                    with self._lock:
                        inflight[index] = inp
                    outcome = self.player.play(inp)
                except Exception as exc:  # the harness's own bug: say so, go on
                    self.report.harness_errors += 1
                    self.say(f"harness error on input {index}: {exc!r}\n"
                             + traceback.format_exc())
                    inflight.pop(index, None)
                    continue
                with self._lock:
                    del inflight[index]
                    self.report.inputs += 1
                    self.report.sent += outcome.sent
                    self.report.received += outcome.received
                    self.report.waited_out += outcome.waited_out
                for leak in outcome.leaks:
                    self.report.escapes += 1
                    self.found("leak", "secret in received bytes: " + _blank_leak(leak),
                               leak, [inp])
                for violation in outcome.violations:
                    self.found("semantics", _blank_violation(violation), violation, [inp])
                if outcome.bad_stream:
                    self.found("stream", f"undecodable server stream: {outcome.bad_stream}",
                               outcome.bad_stream, [inp])

        def sample() -> None:
            assert self.world.daemon is not None
            pid = self.world.daemon.pid
            flagged = False
            while not done.wait(0.05):
                self._rotate_log()
                rss = memory_kib(pid)[0]
                fds = len(os.listdir(f"/proc/{pid}/fd")) if os.path.isdir(f"/proc/{pid}/fd") \
                    else 0
                with self._lock:
                    self.report.rss_peak = max(self.report.rss_peak, rss)
                    self.report.fds_max = max(self.report.fds_max, fds)
                    suspects = list(inflight.values())
                if not flagged and not self.warming and \
                        rss - self.report.rss_base > self.settings.peak_mib * MIB:
                    flagged = True
                    self.found("memory", f"RSS over the baseline by more than "
                               f"{self.settings.peak_mib} MiB while inputs ran",
                               f"RSS {rss / MIB:.0f} MiB, baseline "
                               f"{self.report.rss_base / MIB:.0f} MiB; in flight: "
                               + "; ".join(i.describe() for i in suspects), suspects)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        workers = [threading.Thread(target=work, daemon=True)
                   for _ in range(self.settings.jobs)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        done.set()
        sampler.join()

    # ------------------------------------------------------------ after a batch

    def _rotate_log(self) -> None:
        """Read and empty the log if it grew large while a batch runs."""
        try:
            size = self.log.path.stat().st_size
        except OSError:
            return
        if size > LOG_ROTATE:
            held = [r for r in self.log.poll() if r.suspicious]
            self.held += held[: max(0, HELD_RECORDS - len(self.held))]
            self.log.rotate(0)

    def _after(self, batch: list[int]) -> None:
        daemon = self.world.daemon
        assert daemon is not None
        records, self.held = [*self.held, *self.log.poll()], []
        if not daemon.running:
            status = daemon.process.wait()
            records += self.log.poll(final=True)
            self.found("crash", f"rdc serve exited with status {status}",
                       "\n".join(r.text for r in records[-20:]),
                       [self.input(i) for i in batch[-self.settings.jobs:]])
            self.world.start()
            self.player.port = self.world.port
            self.report.restarts += 1
            self._baseline()
            self.after.clear()
        self._settle()
        targets = descriptor_targets(daemon.pid)
        growth = len(targets) - len(self.baseline_fds)
        if not self.warming:
            self.report.fd_growth = max(self.report.fd_growth, growth)
        if growth > 0 and not self.warming:
            new = _new_targets(self.baseline_fds, targets)
            for kind in sorted({descriptor_kind(t, self.world) for t in new}):
                mine = [t for t in new if descriptor_kind(t, self.world) == kind]
                self.found("fds", f"descriptors ({kind}) not back to the baseline once "
                           "connections closed",
                           f"{len(targets)} open, baseline {len(self.baseline_fds)}; new "
                           f"({kind}):\n" + "\n".join(mine[:40]),
                           [self.input(i) for i in batch[:3]])
        rss = memory_kib(daemon.pid)[0]
        self.report.rss_after = rss
        self.report.rss_peak = max(self.report.rss_peak, rss)
        if rss - self.report.rss_base > self.settings.after_mib * MIB and not self.warming:
            self.found("memory", f"RSS over the baseline by more than "
                       f"{self.settings.after_mib} MiB once connections closed",
                       f"RSS {rss / MIB:.0f} MiB, baseline {self.report.rss_base / MIB:.0f} "
                       "MiB", [])
        if not self.warming:
            self._trend(rss)
        trouble = probe(self.world.port)
        self._canary(batch)  # before anything replays inputs (and resets the canary)
        if trouble:
            self.report.hangs += 1
            sig = "a fresh client could not get in: " + _blank_probe(trouble)
            self.found("hang", sig, trouble, self._probe_culprit(batch, sig))
        self.world.reset_share()
        # Last, so that what the probe and the checks caused is in (and attributed).
        self._suspicious([*records, *self.log.poll()], batch, "")
        self.log.rotate()
        if rss > self.settings.restart_mib * MIB:
            self.say(f"restarting rdc serve at {rss / MIB:.0f} MiB")
            self.world.stop()
            self.world.start()
            self.player.port = self.world.port
            self.report.restarts += 1
            self._baseline()
            self.after.clear()

    def _trend(self, rss: int) -> None:
        """A leak raises the floor of RSS from batch to batch, where a working set levels
        off and swings (malloc arenas, and zstd contexts on worker threads, come and go: a
        server after 2,000-input batches went 61, 94, 242, 175, 126, 132, 152 MiB). The
        lowest RSS of the last TREND_BATCHES batches is compared with the highest of the
        first tenth of the run (at least TREND_BATCHES batches)."""
        self.after.append(rss)
        n = len(self.after)
        if n >= 2 * TREND_BATCHES:
            early = max(self.after[: max(TREND_BATCHES, n // 10)])
            floor = min(self.after[-TREND_BATCHES:])
            if floor - early > self.settings.trend_mib * MIB:
                self.found("memory", "RSS once connections closed keeps growing from batch to "
                           f"batch (by more than {self.settings.trend_mib} MiB)",
                           f"RSS after each batch, MiB: {[r // MIB for r in self.after][-40:]}",
                           [])

    def _settle(self) -> None:
        """Wait until the server holds no more sockets, and no more descriptors in all,
        than when it idled; or, once its sockets are back (before the baseline is known:
        whatever their number), until its descriptors held still for STEADY_SECONDS. The
        server closes a connection's socket a few milliseconds before it lets go of the
        directory the connection opened (its descriptor, the index's three).

        Only the time the server idles counts toward SETTLE_SECONDS: a slow machine can
        keep it at work on an input well after the input's connection closed (on CI, the
        directed attack that makes 2,048 levels of directories, each synced, held its
        connection over 10 s), and that is not a descriptor it lost."""
        assert self.world.daemon is not None
        pid = self.world.daemon.pid
        start = time.monotonic()
        idle = 0.0
        total = len(self.baseline_fds)
        base = sum(1 for t in self.baseline_fds if t.startswith("socket:"))
        last, since = (-1, -1), time.monotonic()
        checked = start
        while idle < SETTLE_SECONDS and checked - start < SETTLE_BUSY_SECONDS:
            targets = descriptor_targets(pid)
            now = (sum(1 for t in targets if t.startswith("socket:")), len(targets))
            if total and now[0] <= base and now[1] <= total:
                return
            if now != last:
                last, since = now, time.monotonic()
            elif (not total or now[0] <= base) and time.monotonic() - since > STEADY_SECONDS:
                return
            time.sleep(0.01)
            was, checked = checked, time.monotonic()
            if not busy(pid):
                idle += checked - was

    def _suspicious(self, records: list[Record], batch: list[int], when: str) -> None:
        for record in suspicious(records):
            address = self.log.peers.get(record.number) if record.number else None
            index = index_of(address) if address else None
            if index is not None and (not batch or index in batch):
                inputs = [self.input(index)]
            elif address is not None and address.startswith("127.0.0.") and batch:
                inputs = self._probe_culprit(batch, signature(record.text))
                when = when or ("met by the harness's own valid client (the probe) after "
                                "this batch; saved: the input that causes it alone, else the "
                                "batch's first three")
            elif when:
                inputs = []
            else:
                inputs = [self.input(i) for i in batch[:3]]
                when = "(not attributed to one input: the batch's first three are saved)"
            self.report.crashes += 1
            self.found("crash", signature(record.text), f"{when}\n{record.text}".strip(),
                       inputs)

    def _canary(self, batch: list[int]) -> None:
        now = self.world.outside_now()
        if now == self.canary:
            return
        self.report.escapes += 1
        diff = tree_diff(self.canary, now)
        tag = self.world.canary.tag
        known = _escape_signature(diff, tag) in self.report.findings
        culprit = None
        if self.settings.attribute and not known:  # replays cost: once per signature
            culprit = self._alone(batch, lambda: self.world.outside_now() != self.canary)
            if culprit is not None:  # what that input alone changed
                diff = tree_diff(self.canary, self.world.outside_now())
        if culprit is not None:
            inputs = [self.input(culprit)]
        else:  # a known escape is counted, not saved again with bystanders
            inputs = [] if known else [self.input(i) for i in batch[:3]]
        self.found("escape", _escape_signature(diff, tag),
                   ("" if culprit is not None else "(no single input of the batch repeated "
                    "it alone; the batch's first three are saved)\n") + "\n".join(diff[:40]),
                   inputs)
        self.world.reset_canary()
        self.canary = self.world.outside_now()

    def _alone(self, batch: list[int], symptom: Callable[[], bool]) -> int | None:
        """The first input of ``batch`` that shows ``symptom`` when played alone, from a
        reset share and canary (the share is reset again afterwards)."""
        found = None
        for index in batch:
            self.world.reset_canary()
            self.world.reset_share()
            self.canary = self.world.outside_now()
            self.player.play(self.input(index))
            self._settle()
            if symptom():
                found = index
                break
        return found

    def _probe_culprit(self, batch: list[int], sig: str) -> list[Input]:
        """For a new trouble met by the probe: the input that causes it alone, if one does
        (else the batch's first three)."""
        culprit = None
        if self.settings.attribute and sig not in self.report.findings:
            culprit = self._alone(batch, lambda: bool(probe(self.world.port)))
            self.world.reset_share()
        if culprit is not None:
            return [self.input(culprit)]
        return [self.input(i) for i in batch[:3]]

    def _floods(self) -> None:
        """Each flood against a freshly started server: what the inputs left in memory
        would hide what the flood itself costs."""
        for flood in FLOODS:
            self._suspicious(self.log.poll(), [], "before the floods")
            self.world.stop()
            self.world.start()
            self.player.port = self.world.port
            self.say(f"flood: {flood.__name__}")
            result = flood(self.world)
            self.report.floods.append(result)
            self.report.rss_peak = max(self.report.rss_peak, result.peak)
            if result.peak - result.before > self.settings.peak_mib * MIB:
                self.found("memory", f"flood {result.name}: RSS grew by more than "
                           f"{self.settings.peak_mib} MiB", result.detail, [])
            if result.after - result.before > self.settings.after_mib * MIB:
                self.found("memory", f"flood {result.name}: memory still held after the "
                           "connection closed", result.detail, [])
        records = self.log.poll()
        self._suspicious(records, [], "the floods")

    # ------------------------------------------------------------ findings

    def found(self, kind: str, sig: str, detail: str, inputs: list[Input]) -> None:
        with self._lock:
            finding = self.report.findings.get(sig)
            fresh = finding is None
            if finding is None:
                finding = self.report.findings[sig] = Finding(kind, sig, detail)
            finding.count += 1
            new = [i for i in inputs if i.index not in finding.indices][: 5 - len(
                finding.indices)]
            finding.indices += [i.index for i in new]
        if fresh:
            self.say(f"finding [{kind}] {sig}")
        if self.results is not None and (fresh or new):
            self._save(finding, new, detail if fresh else "")

    def _save(self, finding: Finding, inputs: list[Input], detail: str) -> None:
        assert self.results is not None
        if finding.where is None:
            n = len(list(self.results.glob(f"{finding.kind}-*"))) + 1
            finding.where = self.results / f"{finding.kind}-{n:03}"
            finding.where.mkdir()
        with open(finding.where / "finding.txt", "a") as f:
            if detail:
                f.write(f"[{finding.kind}] {finding.signature}\n\n{detail}\n\n")
            for inp in inputs:
                path = finding.where / f"input-{inp.index}.bin"
                dump(inp, path)
                f.write(f"input: {inp.describe()}\n  reproduce: python bench/fuzz.py "
                        f"--replay {path}\n")
                if inp.level in LEVELS:  # made by the mutator: its seed and index say it
                    f.write(f"  or: python bench/fuzz.py --seed {inp.seed} --only "
                            f"{inp.index}\n")

    def _write_summary(self) -> None:
        if self.results is not None:
            (self.results / "summary.txt").write_text(self.report.summary() + "\n")


def _new_targets(before: list[str], after: list[str]) -> list[str]:
    left = list(before)
    new = []
    for target in after:
        if target in left:
            left.remove(target)
        else:
            new.append(target)
    return sorted(new)


def _blank_leak(text: str) -> str:
    kind = re.search(r"in a ('[^']*'|None) message", text)
    secret = "the secret file's content" if "SECRET-" in text else "a canary name"
    return f"{secret} in a {kind.group(1) if kind else '?'} message"


def _blank_violation(text: str) -> str:
    """One signature per rule broken, whatever the request."""
    if "after an open without write" in text:
        return "a write request answered after an open without write (not refused)"
    return re.sub(r"^a \w+ with", "a request with", re.sub(r": \{.*", "", text))


def _blank_probe(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", text)[:200]


def _escape_signature(diff: list[str], tag: str) -> str:
    what = sorted({_blank_change(line, tag) for line in diff})
    return "outside the share changed: " + "; ".join(what)[:300]


def _blank_change(line: str, tag: str) -> str:
    """A tree_diff line reduced to the path and the kind of change."""
    path, _, rest = line.partition(": ")
    path = path.replace(tag, "TAG")
    old, _, new = rest.partition(" != ")
    if old == "None":
        return f"{path} created"
    if new == "None":
        return f"{path} removed"
    a, b = old.split(" "), new.split(" ")
    changed = [name for name, x, y in itertools.zip_longest(
        ["kind", "mode", "mtime", "content"], a, b) if x != y]
    return f"{path} {'/'.join(n for n in changed if n)} changed"
