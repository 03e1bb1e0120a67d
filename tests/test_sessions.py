"""The class's shared compute-sanitizer sessions (autograder.sessions), served to many askers at once.

A session here is a CPU-backend worker, as compute-sanitizer's is a GPU one, and a kernel that prints lines of the
tool's form stands for the tool's report: the CPU backend flushes a kernel's printf at the end of its launch, as a
GPU does. The GPU runs (tests/test_class_scheduling.py, the class bench) use the real tools.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from pathlib import Path

import pytest

from autograder import isolation, sessions
from autograder.build import Builder
from autograder.errors import GraderError
from autograder.isolation import Worker
from autograder.records import Build, KernelSource
from autograder.references import reference_source
from autograder.sanitizer import PREFIX, TOOLS, Sanitized, sanitize
from autograder.sessions import Address, RemoteSession, SessionHost
from autograder.stages import get_stage
from autograder.verify import Case, loaded

CASE = Case((1000,), "random", 7)
WILD = Path(__file__).parent / "cpu_kernels" / "wild_pointer.cu"


def saying(word: str) -> str:
    """The naive reference kernel, printing one report-like line naming `word` from each block it runs."""
    text = reference_source("naive").text
    marker = "    if (tid == 0) {\n"
    assert marker in text
    return text.replace(marker, f'{marker}        printf("{PREFIX}from {word}\\n");\n', 1)


@pytest.fixture(scope="module")
def builds() -> dict[str, Build]:
    with Worker("cpu") as worker:
        builder = Builder(worker.device, worker.sandbox)
        made = {word: builder.build(get_stage("naive"), KernelSource(saying(word))) for word in ("ann", "bob", "cyd")}
        made["wild"] = builder.build(get_stage("naive"), KernelSource(WILD.read_text()))
        made["quiet"] = builder.build(get_stage("shuffle"), reference_source("shuffle"))
    return made


class Sessions:
    """A host whose sessions are CPU-backend workers, every one it makes kept for the test to look into."""

    def __init__(self) -> None:
        self.made: list[Worker] = []
        self.host = SessionHost(self._make, TOOLS, (0,))

    def _make(self, tool: str, gpu: int) -> Worker:
        self.made.append(Worker("cpu"))
        return self.made[-1]

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *_: object) -> None:
        self.host.close()


def test_askers_at_once_share_one_session_and_each_gets_the_report_of_its_own_run_alone(
    builds: dict[str, Build],
) -> None:
    answers: dict[str, list[tuple[str | None, list[str]]]] = {}

    def ask(word: str) -> None:
        remote = RemoteSession(sessions.host.address, "racecheck", 0)
        try:
            answers[word] = [remote.run(builds[word], CASE, 256, nullcontext) for _ in range(6)]
        finally:
            remote.close()

    with Sessions() as sessions:
        askers = [threading.Thread(target=ask, args=(word,)) for word in ("ann", "bob", "cyd")]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join()
        assert len(sessions.made) == len(TOOLS)  # one a tool: all eighteen runs went to one racecheck session
        racecheck = sessions.made[TOOLS.index("racecheck")]
        # After each run the session forgot the kernel and emptied its output.
        assert racecheck.call(loaded, timeout=30) == 0 and racecheck.log_size() == 0
    assert sorted(answers) == ["ann", "bob", "cyd"]
    for word, runs in answers.items():
        for failed, lines in runs:
            assert failed is None
            assert lines and set(lines) == {f"from {word}"}  # its own lines, every one of them, and no others'


def test_a_kernel_that_ends_a_shared_session_costs_the_next_asker_nothing(builds: dict[str, Build]) -> None:
    with Sessions() as sessions:
        crasher = RemoteSession(sessions.host.address, "memcheck", 0)
        failed, lines = crasher.run(builds["wild"], CASE, 256, nullcontext)
        assert failed is not None and "SIGSEGV" in failed and lines == []
        crasher.close()
        after = RemoteSession(sessions.host.address, "memcheck", 0)
        failed, lines = after.run(builds["bob"], CASE, 256, nullcontext)
        after.close()
    assert failed is None and set(lines) == {"from bob"}  # in a fresh session, with nothing of the crash's


def test_sanitize_runs_a_quiet_kernel_in_the_class_session_and_reads_its_answer(builds: dict[str, Build]) -> None:
    asked: list[str] = []
    with Sessions() as sessions:
        remote = {tool: RemoteSession(sessions.host.address, tool, 0) for tool in TOOLS}

        def session(tool: str, _: tuple[str, ...], how: str) -> Worker | RemoteSession:
            asked.append(how)
            return remote[tool]

        try:
            seen = sanitize({"shuffle": builds["quiet"]}, "compute-sanitizer", session, set(), 256, nullcontext)
        finally:
            for each in remote.values():
                each.close()
    assert asked == ["shared"] * len(TOOLS)
    assert seen["shuffle"].findings == () and seen["shuffle"].notes == ()


def test_only_the_graders_processes_reach_the_sessions(builds: dict[str, Build]) -> None:
    with Sessions() as sessions:
        address = sessions.host.address
        stranger = RemoteSession(Address(address.path, b"not the key"), "racecheck", 0)
        with pytest.raises(GraderError, match="cannot be reached"):
            stranger.run(builds["ann"], CASE, 256, nullcontext)
        nowhere = RemoteSession(address, "racecheck", 7)  # no session on that GPU: the asker is told
        with pytest.raises(GraderError, match="no shared racecheck session on GPU 7"):
            nowhere.run(builds["ann"], CASE, 256, nullcontext)
        nowhere.close()
        known = RemoteSession(address, "racecheck", 0)  # the host serves on
        assert known.run(builds["ann"], CASE, 256, nullcontext)[0] is None
        known.close()
    with pytest.raises(GraderError, match="cannot be reached"):  # gone with its class
        RemoteSession(address, "racecheck", 0).run(builds["ann"], CASE, 256, nullcontext)
    assert not Path(address.path).parent.exists()


def test_a_student_whose_kernel_stops_a_shared_session_takes_sessions_of_its_own_for_the_rest(
    builds: dict[str, Build],
) -> None:
    # A hang in a shared session holds up every student waiting for it, up to the run's limit: a student can do
    # that once, not once a stage and tool. Here the kernel crashes its memcheck run; what comes after is its own.
    asked: list[str] = []
    own: list[Worker] = []
    with Sessions() as sessions:
        remote = {tool: RemoteSession(sessions.host.address, tool, 0) for tool in TOOLS}

        def session(tool: str, _: tuple[str, ...], how: str) -> Worker | RemoteSession:
            asked.append(how)
            if how == "shared":
                return remote[tool]
            own.append(Worker("cpu"))
            return own[-1]

        try:
            seen = sanitize({"naive": builds["wild"], "shuffle": builds["quiet"]}, "compute-sanitizer", session,
                            set(), 256, nullcontext)
        finally:
            for each in (*remote.values(), *own):
                each.close()
    assert asked == ["shared"] + ["student"] * 5  # memcheck on naive, then shuffle, and each other tool
    assert seen["shuffle"].findings == () and seen["shuffle"].notes == ()
    assert all("could not finish" in note for note in seen["naive"].notes) and seen["naive"].notes


def test_a_session_that_cannot_start_answers_each_run_with_why(builds: dict[str, Build]) -> None:
    host = SessionHost(lambda tool, gpu: Worker("cpu", launcher=("/bin/false",)), TOOLS, (0,))
    try:
        remote = RemoteSession(host.address, "memcheck", 0)
        failed, lines = remote.run(builds["quiet"], CASE, 256, nullcontext)  # a note for the stage, as alone
        remote.close()
    finally:
        host.close()
    assert failed is not None and "starting the backend" in failed and lines == []


class Counted(Worker):
    """A worker that counts the times it is asked to start."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        super().start()


def test_a_session_whose_start_hangs_is_not_started_again_at_every_run(
    builds: dict[str, Build], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each try of a start that hangs takes STARTUP_SECONDS (120 s), in the session's turn: tried again at every
    # run, it would hold up every asker of the class that long, one after another.
    monkeypatch.setattr(isolation, "STARTUP_SECONDS", 1.0)
    made: dict[str, Counted] = {}

    def hanging(tool: str, gpu: int) -> Worker:
        made[tool] = Counted("cpu", launcher=("/bin/sh", "-c", "exec sleep 600"))  # never says it is up
        return made[tool]

    host = SessionHost(hanging, TOOLS, (0,))
    try:
        remote = RemoteSession(host.address, "memcheck", 0)
        answers = [remote.run(builds["quiet"], CASE, 256, nullcontext) for _ in range(3)]
        tried = made["memcheck"].starts
        assert tried == 1  # started ahead by the host; none of the three runs tried again
        monkeypatch.setattr(sessions, "RETRY_SECONDS", 0.0)  # its time has come: the next run tries again
        again = remote.run(builds["quiet"], CASE, 256, nullcontext)
        remote.close()
    finally:
        host.close()
    for failed, lines in (*answers, again):
        assert failed is not None and "starting the backend ran past" in failed and lines == []
    assert made["memcheck"].starts > tried


def test_the_kernel_of_an_asker_that_has_gone_is_not_run(builds: dict[str, Build]) -> None:
    with Sessions() as sessions:
        session = sessions.host._sessions["racecheck", 0]
        failed, lines = session.run(builds["ann"], CASE, 256, asking=lambda: False)
        assert "went away" in (failed or "") and lines == []
        assert sessions.made[TOOLS.index("racecheck")].log_size() == 0  # nothing ran: nothing printed


def test_closed_sessions_serve_no_one_and_leave_nothing_running(builds: dict[str, Build]) -> None:
    sessions = Sessions()
    remote = RemoteSession(sessions.host.address, "racecheck", 0)
    assert remote.run(builds["ann"], CASE, 256, nullcontext)[0] is None
    sessions.host.close()
    with pytest.raises(GraderError):  # connected before the close, asking after it
        remote.run(builds["ann"], CASE, 256, nullcontext)
    remote.close()
    assert not any(worker.alive for worker in sessions.made)
    assert "sessions" not in {thread.name for thread in threading.enumerate()}


class Watched(Worker):
    """A CPU-backend session that records each run's tool and kernel as it starts and ends, and can hold a run
    until a given run of another tool has ended."""

    def __init__(self, tool: str, log: list[tuple[str, str, str]], lock: threading.Lock,
                 waits: dict[tuple[str, str], tuple[str, str]], ended: dict[tuple[str, str], threading.Event]) -> None:
        super().__init__("cpu")
        self.tool, self.log, self.lock, self.waits, self.ended = tool, log, lock, waits, ended

    def call(self, fn, *args, timeout):  # type: ignore[no-untyped-def]
        if fn.__name__ != "sanitized_run":
            return super().call(fn, *args, timeout=timeout)
        run = (self.tool, args[0].source.text)
        if run in self.waits:  # held until that run of another tool has ended: proof that the two overlap
            assert self.ended[self.waits[run]].wait(30), f"{run} was not run beside {self.waits[run]}"
        with self.lock:
            self.log.append(("start", *run))
        try:
            return super().call(fn, *args, timeout=timeout)
        finally:
            with self.lock:
                self.log.append(("end", *run))
            self.ended.setdefault(run, threading.Event()).set()


def test_the_tools_run_at_once_and_each_stage_reaches_the_others_after_memcheck(builds: dict[str, Build]) -> None:
    # memcheck runs first on each stage (a kernel it catches is not memory-safe for the others); the other tools
    # follow stage by stage beside it, so a student's phase takes about one tool's runs, not three.
    stages = {"naive": builds["ann"], "sequential": builds["bob"], "shuffle": builds["quiet"]}
    texts = {build.source.text: stage_id for stage_id, build in stages.items()}
    log: list[tuple[str, str, str]] = []
    lock = threading.Lock()
    ended: dict[tuple[str, str], threading.Event] = {
        (tool, build.source.text): threading.Event() for tool in TOOLS for build in stages.values()
    }
    # memcheck's last run waits for racecheck's and synccheck's first: run one tool after another, this fails.
    last, first = stages["shuffle"].source.text, stages["naive"].source.text
    waits = {("memcheck", last): ("racecheck", first), ("racecheck", stages["sequential"].source.text):
             ("synccheck", first)}
    made: dict[str, Watched] = {}

    def session(tool: str, _: tuple[str, ...], how: str) -> Worker:
        if tool not in made:
            made[tool] = Watched(tool, log, lock, waits, ended)
        return made[tool]

    try:
        seen = sanitize(stages, "compute-sanitizer", session, set(), 256, nullcontext)
    finally:
        for each in made.values():
            each.close()
    order = [(event, tool, texts[text]) for event, tool, text in log]
    for tool in ("racecheck", "synccheck"):
        for stage_id in stages:
            assert order.index(("end", "memcheck", stage_id)) < order.index(("start", tool, stage_id))
        assert [stage for event, asker, stage in order if asker == tool and event == "start"] == list(stages)
    assert set(seen) == set(stages) and all(each == Sanitized() for each in seen.values())  # every run finished


def test_a_memcheck_that_fails_stops_the_other_tools_where_it_stopped(builds: dict[str, Build]) -> None:
    # Where memcheck did not run a kernel, whether it is memory-safe is unknown: no other tool runs it, shared or
    # not, and the phase fails as before (the pipeline keeps the other checkers' verdicts).
    asked: list[tuple[str, str]] = []
    made: list[Worker] = []

    class Broken(Worker):
        def call(self, fn, *args, timeout):  # type: ignore[no-untyped-def]
            if fn.__name__ == "sanitized_run" and args[0] is builds["bob"]:
                raise GraderError("the class's shared memcheck session cannot be reached")
            return super().call(fn, *args, timeout=timeout)

    def session(tool: str, _: tuple[str, ...], how: str) -> Worker:
        made.append(Broken("cpu") if tool == "memcheck" else Worker("cpu"))
        asked.append((tool, how))
        return made[-1]

    try:
        with pytest.raises(GraderError, match="cannot be reached"):
            sanitize({"naive": builds["quiet"], "sequential": builds["bob"], "shuffle": builds["ann"]},
                     "compute-sanitizer", session, set(), 256, nullcontext)
    finally:
        for each in made:
            each.close()
    assert sorted(asked) == sorted([("memcheck", "shared"), ("memcheck", "alone"), ("racecheck", "shared"),
                                    ("synccheck", "shared")])  # bob's and ann's kernels ran under no other tool


def test_any_tool_that_fails_stops_the_others(builds: dict[str, Build]) -> None:
    # The phase fails where one tool cannot run (the class's racecheck session cannot be reached, say): the
    # other tools stop at their next kernel, not run every stage up to its limit for a phase thrown away.
    ran: list[str] = []

    class Unreachable(Worker):
        def start(self) -> None:  # racecheck's fails at once, not after a worker's start that others overtake
            if self.tool == "racecheck":
                ran.append(self.tool)
                raise GraderError("the class's shared racecheck session cannot be reached")
            super().start()

        def call(self, fn, *args, timeout):  # type: ignore[no-untyped-def]
            if fn.__name__ == "sanitized_run":
                ran.append(self.tool)
            return super().call(fn, *args, timeout=timeout)

    made: dict[str, Unreachable] = {}

    def session(tool: str, _: tuple[str, ...], how: str) -> Worker:
        if tool not in made:
            made[tool] = Unreachable("cpu")
            made[tool].tool = tool  # type: ignore[attr-defined]
        return made[tool]

    stages = {"naive": builds["quiet"], "sequential": builds["quiet"], "shuffle": builds["quiet"],
              "unrolled_warp": builds["quiet"]}
    try:
        with pytest.raises(GraderError, match="racecheck session cannot be reached"):
            sanitize(stages, "compute-sanitizer", session, set(), 256, nullcontext)
    finally:
        for each in made.values():
            each.close()
    assert ran.count("racecheck") == 1 and ran.count("synccheck") <= 2  # memcheck, ahead, may be done
