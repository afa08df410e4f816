"""Workers end with the training process whatever the signal, leave no shared memory, and shutdown never hangs.

Each end-to-end case runs a training loop in a subprocess that is its own session (as a job under a
terminal, ``timeout`` or a batch system is), so every process the loader starts can be found afterwards
by its session id, whoever its parent has become.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported")

from dali_alchemi import DALIDataLoader, LoaderError
from dali_alchemi.pipeline.build import PipelineOutputs
from dali_alchemi.pipeline.dali_private import close_pipeline, worker_processes
from dali_alchemi.pipeline.iterator import WindowIterator
from tests.processes import HANG_S, shm_mappings, shm_names

pytestmark = [pytest.mark.dali, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

ROOT = Path(__file__).resolve().parents[2]

PARENT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

LOOPS = """
import contextlib, faulthandler, os, signal, sys, threading
from dali_alchemi import DALIDataLoader

# a training script started from a terminal has the default Ctrl-C, terminate and hang-up actions, also
# where this suite runs with some ignored (nohup ignores SIGHUP; a non-interactive shell's background job,
# SIGINT): the loader installs its handlers only over the defaults
signal.signal(signal.SIGINT, signal.default_int_handler)
for _signum in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_signum, signal.SIG_DFL)

# what a hung run was doing, for the failure message: every thread's stack (written by C code, so also
# while the main thread is stuck outside Python), and what Ctrl-C would do in each process
faulthandler.register(signal.SIGUSR1, all_threads=True)
signal.signal(signal.SIGUSR2, lambda *_: print(
    os.getpid(), *(f"{s.name}: {signal.getsignal(s)}" for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)),
    file=sys.stderr,
))


def train(store, start_method="fork", where="main"):
    if where == "thread":  # built and iterated on a thread that is not the main thread
        threading.Thread(target=train, args=(store, start_method), daemon=True).start()
        threading.Event().wait()
    with DALIDataLoader(store, batch_size=10, batches_per_window=2, num_workers=2, start_method=start_method,
                        device="cpu") as loader:
        first = True
        while True:
            for batch in loader:
                if first:
                    print("iterating", flush=True)
                    first = False
            print("epoch", flush=True)


def wedged(store, closed_by="with"):
    loader = DALIDataLoader(store, batch_size=10, batches_per_window=2, num_workers=2, device="cpu")
    with loader if closed_by == "with" else contextlib.nullcontext():  # else: left open, for the exit hook
        batches = iter(loader)
        next(batches)
        lock = loader._pipe._py_pool.pool._general_task_queue.lock
        holder = os.fork()
        if holder == 0:  # dies holding DALI's task-queue lock, as a worker killed mid-handshake can
            lock.acquire()
            os._exit(0)
        os.waitpid(holder, 0)
        print("iterating", flush=True)
        for batch in batches:  # the pipeline thread now waits on that lock for ever
            pass
"""

TRAIN = (
    LOOPS
    + """
if __name__ == "__main__":
    print("started", os.getpid(), flush=True)
    train(*sys.argv[1:])
"""
)

FORKER = (
    LOOPS
    + """
def serve():
    # Imports once, then forks one training process per request: each is a new session whose stderr
    # goes to the file named in the request; reports its pid, then its exit status.
    print("ready", flush=True)
    for line in sys.stdin:
        case, stderr_path, *args = line.split()
        pid = os.fork()
        if pid == 0:
            os.setsid()  # its signal actions are the defaults LOOPS set on import
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            print("started", os.getpid(), flush=True)
            {"train": train, "wedged": wedged}[case](*args)
            return  # a KeyboardInterrupt propagates to the top level as in any script
        _, status = os.waitpid(pid, 0)
        # on a line of its own: a Ctrl-C inside the child's print("epoch") can leave "epoch" written
        # without its newline, and the child flushes that at exit
        print(f"\\nexit {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    serve()
"""
)


# -- /proc helpers ---------------------------------------------------------------------------------
def _stat(pid: str) -> tuple[str, int] | None:
    """(state, session id) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[3])


def session_processes(sid: int, zombies: bool = False) -> list[int]:
    """Live processes of session ``sid`` (zombies too, if asked)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            stat = _stat(pid)
            if stat is not None and stat[1] == sid and (zombies or stat[0] != "Z"):
                found.append(int(pid))
    return found


def threads_in_kernel(pid: int) -> str:
    """Each thread of ``pid`` as the kernel sees it: name, state, wait channel and kernel stack (if readable)."""

    def read(path: Path) -> str:
        try:
            return path.read_text().strip()
        except OSError as err:
            return f"<{type(err).__name__}>"

    lines = [f"process {pid} ({read(Path(f'/proc/{pid}/cmdline')).replace(chr(0), ' ')[:80]}):"]
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            task = Path(f"/proc/{pid}/task/{tid}")
            state = read(task / "stat").rsplit(")", 1)[-1].split()[:1]
            stack = " <- ".join(line.split("] ")[-1] for line in read(task / "stack").splitlines()[:6])
            lines.append(
                f"  thread {tid} {read(task / 'comm')!r} state {state} wchan {read(task / 'wchan')!r} "
                f"syscall {read(task / 'syscall').split()[:1]} stack {stack}"
            )
    return "\n".join(lines)


def mapped_anywhere(segments: set[str]) -> set[str]:
    """Which of ``segments`` any process on the machine still maps."""
    pids = [int(pid) for pid in os.listdir("/proc") if pid.isdigit()]
    return shm_mappings(pids) & segments


def dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


class Lines:
    """The lines a process writes to a pipe, read on a thread so that waiting for one can time out."""

    def __init__(self, stream: Any) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            if line.strip():  # blank lines carry nothing; "" is kept for the end of the stream
                self._queue.put(line.strip())
        self._queue.put("")

    def expect(self, prefix: str, timeout: float) -> str | None:
        """The next line starting with ``prefix`` (others are skipped), or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line.startswith(prefix) or not line:
                return line or None

    def next(self, timeout: float) -> str | None:
        """The next line, or None after ``timeout`` or once the stream has ended."""
        try:
            return self._queue.get(timeout=max(0.0, timeout)) or None
        except queue.Empty:
            return None

    def drain(self) -> None:
        """Forget the lines that have arrived so far."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()


class Training:
    """A training loop in a process of its own session: started, signalled, waited for."""

    def __init__(self, lines: Lines, stderr_path: Path, what: str) -> None:
        self.lines, self.stderr_path = lines, stderr_path
        started = lines.expect("started", 120)
        assert started is not None, f"the training process did not start: {self.stderr()}"
        self.pid = int(started.split()[1])
        self.what = what

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def stacks(self) -> str:
        """What each thread of each process of the session is doing: the kernel's view of every thread
        (state, wait channel, kernel stack where readable), then each Python thread's stack and Ctrl-C
        handler as the process itself writes them to its stderr (nothing once Python has finalized)."""
        kernel = [threads_in_kernel(pid) for pid in session_processes(self.pid, zombies=True)]
        for pid in session_processes(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
                os.kill(pid, signal.SIGUSR2)
        time.sleep(2.0)
        return "\n".join(kernel or ["no process left in the session"]) + "\nstderr:\n" + self.stderr()

    def wait_iterating(self) -> None:
        assert self.lines.expect("iterating", 120) is not None, f"{self.what} never iterated: {self.stderr()}"

    def wait(self, timeout: float) -> int | None:
        raise NotImplementedError


class Script(Training):
    """``python train.py ...``: the real thing, interpreter start-up included (slow on a busy machine)."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        script = tmp_path / "train.py"
        script.write_text(TRAIN)
        stderr_path = tmp_path / "stderr.txt"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True, env=env,
            )  # fmt: skip
        super().__init__(Lines(self.proc.stdout), stderr_path, f"train.py {' '.join(args)}")

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class Forked(Training):
    """A training process forked from a process that imported everything once (a second, not five)."""

    def __init__(self, forker: Forker, tmp_path: Path, case: str, *args: str) -> None:
        stderr_path = tmp_path / f"stderr-{case}-{time.monotonic_ns()}.txt"
        forker.send(f"{case} {stderr_path} {' '.join(args)}")
        self.exited: str | None = None
        self.forker_pid = forker.proc.pid
        super().__init__(forker.lines, stderr_path, f"{case} {' '.join(args)}")

    def stacks(self) -> str:
        return f"the forker: {threads_in_kernel(self.forker_pid)}\n" + super().stacks()

    def wait(self, timeout: float) -> int | None:
        line = self.exited or self.lines.expect("exit", timeout)
        return None if line is None else int(line.split()[1])

    def went_on(self, epochs: int, timeout: float) -> bool | None:
        """After a signal: True once the loop has finished ``epochs`` more epochs, False once the process has
        exited, None when neither happened within ``timeout`` (a hang).

        Counts events, not time: an epoch line already on its way when the signal was sent is one epoch, so
        asking for two means that the loop went on after the signal was handled (or dropped).
        """
        deadline, finished = time.monotonic() + timeout, 0
        while (line := self.lines.next(deadline - time.monotonic())) is not None:
            if line.startswith("exit"):
                self.exited = line
                return False
            finished += line == "epoch"
            if finished >= epochs:
                return True
        return None


class Forker:
    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "forker.py"
        script.write_text(FORKER)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.lines = Lines(self.proc.stdout)
        assert self.lines.expect("ready", 120) == "ready", "the forker did not start"

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def forker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forker]:
    f = Forker(tmp_path_factory.mktemp("forker"))
    yield f
    f.close()


def assert_all_gone(training: Training, before_shm: set[str], segments: set[str]) -> int:
    """The training process exits (HANG_S bounds the wait), then nothing of its session is left; its exit code."""
    code = training.wait(HANG_S)
    if code is None:
        stacks = training.stacks()
        left = session_processes(training.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        training.wait(30)
        raise AssertionError(
            f"{training.what} hung: it did not exit within {HANG_S} s (left: {left}); its stacks: {stacks}"
        )
    deadline = time.monotonic() + HANG_S
    while session_processes(training.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = session_processes(training.pid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the loader outlived the training process by {HANG_S} s: {left}"
    assert not mapped_anywhere(segments), "the loader's shared memory is still mapped by some process"
    # what is new in /dev/shm and was the loader's: the names its session had mapped (other programs,
    # other tests' loaders among them, may create and remove entries meanwhile)
    ours = (dev_shm() - before_shm) & shm_names(segments)
    assert not ours, f"/dev/shm holds the loader's entries: {sorted(ours)}"
    return code


def signal_while_iterating(training: Training, signum: int, *, group: bool, delay: float = 0.0) -> int:
    """Wait until the loop iterates (plus ``delay``), send ``signum``, check that all is gone; the exit code."""
    before_shm = dev_shm()
    training.wait_iterating()
    time.sleep(delay)
    workers = [pid for pid in session_processes(training.pid) if pid != training.pid]
    segments = shm_mappings(session_processes(training.pid))
    assert len(workers) >= 2, f"expected the loader's 2 workers in the session, found {workers}"
    assert segments, "the loader's workers map no shared memory (DALI's layout changed?)"
    os.killpg(training.pid, signum) if group else os.kill(training.pid, signum)
    return assert_all_gone(training, before_shm, segments)


# -- end to end: each signal -----------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("signum", "group"),
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGKILL, False), (signal.SIGINT, True)],
    ids=["TERM", "HUP", "KILL", "INT-group"],
)
def test_workers_end_with_the_training_process(
    small_store: Path, forker: Forker, tmp_path: Path, signum: int, group: bool
) -> None:
    training = Forked(forker, tmp_path, "train", str(small_store))
    code = signal_while_iterating(training, signum, group=group)
    # the process ends as it would have without a loader: by the signal (Python re-raises SIGINT's)
    assert code == -signum, training.stderr()
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in training.stderr()
        # workers ignore Ctrl-C and are stopped by the loader; one killed by it mid-handshake with DALI
        # could leave a queue's lock held (the rare hang)
        assert "Process ForkProcess" not in training.stderr(), training.stderr()


@pytest.mark.timeout(120)
def test_sigkill_of_a_loader_iterated_off_the_main_thread(small_store: Path, forker: Forker, tmp_path: Path) -> None:
    """prctl's death signal follows the thread that started the workers, so here only the watchdog acts."""
    training = Forked(forker, tmp_path, "train", str(small_store), "fork", "thread")
    assert signal_while_iterating(training, signal.SIGKILL, group=False) == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_of_a_training_script(small_store: Path, tmp_path: Path) -> None:
    """The same through a real interpreter start and exit, as ``timeout`` or a scheduler would send it."""
    training = Script(tmp_path, str(small_store))
    assert signal_while_iterating(training, signal.SIGTERM, group=False) == -signal.SIGTERM, training.stderr()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
def test_spawned_workers_end_with_the_training_process(small_store: Path, tmp_path: Path, signum: int) -> None:
    training = Script(tmp_path, str(small_store), "spawn")
    assert signal_while_iterating(training, signum, group=False) == -signum, training.stderr()


@pytest.mark.timeout(120)
def test_ctrl_c_while_dali_is_wedged_exits_within_seconds(small_store: Path, forker: Forker, tmp_path: Path) -> None:
    """A process died holding DALI's task-queue lock: the pipeline thread waits for ever, shutdown must not."""
    training = Forked(forker, tmp_path, "wedged", str(small_store))
    code = signal_while_iterating(training, signal.SIGINT, group=True, delay=0.5)
    assert code == -signal.SIGINT and "KeyboardInterrupt" in training.stderr(), training.stderr()
    assert "did not stop within" in training.stderr()  # the bounded wait gave up on the stuck thread, and said so


@pytest.mark.timeout(120)
def test_ctrl_c_while_dali_is_wedged_and_the_loader_left_open(
    small_store: Path, forker: Forker, tmp_path: Path
) -> None:
    """No ``with``, no close(): the loader is closed at interpreter exit, before DALI's own unbounded exit hooks."""
    training = Forked(forker, tmp_path, "wedged", str(small_store), "nobody")
    code = signal_while_iterating(training, signal.SIGINT, group=True, delay=0.5)
    assert code == -signal.SIGINT and "did not stop within" in training.stderr(), training.stderr()


def _interrupt_at_random_moments(store: Path, forker: Forker, tmp_path: Path, runs: int, seed: int) -> int:
    """Ctrl-C each run at a random moment; how many runs needed a second Ctrl-C.

    CPython drops a ``KeyboardInterrupt`` that lands inside a finalizer or weakref callback, a fork
    hook or a Cython module's initialisation (with or without an "Exception ignored" message). The
    loop then simply goes on, as any Python program would, and a user presses Ctrl-C again; so does
    this test once the loop has finished two more epochs after the first one. Whatever else happens,
    the run must then exit and leave nothing behind; a run that neither exits nor iterates is a hang.
    """
    rng = random.Random(seed)
    pressed_twice = 0
    for run in range(runs):
        before_shm = dev_shm()
        training = Forked(forker, tmp_path, "train", str(store))
        time.sleep(rng.uniform(0.0, 2.0))  # the random moment: construction, start-up, iteration or an epoch's end
        segments = shm_mappings(session_processes(training.pid))
        training.lines.drain()  # epochs finished before the Ctrl-C do not count as going on after it
        os.killpg(training.pid, signal.SIGINT)
        went_on = training.went_on(epochs=2, timeout=HANG_S)
        assert went_on is not None, (
            f"run {run}: neither exited nor iterated within {HANG_S} s of Ctrl-C; its stacks: {training.stacks()}"
        )
        if went_on:
            pressed_twice += 1
            segments |= shm_mappings(session_processes(training.pid))
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile after all
                os.killpg(training.pid, signal.SIGINT)
        code = assert_all_gone(training, before_shm, segments)
        assert code == -signal.SIGINT, f"run {run}: {training.stderr()}"
        assert "Process ForkProcess" not in training.stderr(), f"run {run}: {training.stderr()}"
    return pressed_twice


@pytest.mark.timeout(300)
def test_ctrl_c_at_random_moments(small_store: Path, forker: Forker, tmp_path: Path) -> None:
    _interrupt_at_random_moments(small_store, forker, tmp_path, runs=3, seed=11)


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_ctrl_c_at_random_moments_many_times(small_store: Path, forker: Forker, tmp_path: Path) -> None:
    runs = 100
    pressed_twice = _interrupt_at_random_moments(small_store, forker, tmp_path, runs=runs, seed=12)
    assert pressed_twice <= runs // 10, f"{pressed_twice} of {runs} runs went on after the first Ctrl-C"


# -- in process ------------------------------------------------------------------------------------
def _signal_mask(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _has(mask: int, signum: int) -> bool:
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.timeout(60)
def test_workers_ignore_ctrl_c_and_take_the_default_action_for_term_and_hup(small_store: Path) -> None:
    previous = {signum: signal.getsignal(signum) for signum in PARENT_SIGNALS}
    try:
        for signum in PARENT_SIGNALS:  # a handler in the parent, which a forked worker inherits
            signal.signal(signum, lambda *_: None)
        with DALIDataLoader(small_store, batch_size=30, num_workers=2, start_method="fork", device="cpu") as loader:
            next(iter(loader))
            workers = [proc.pid for proc in worker_processes(loader._pipe)]
            assert len(workers) == 2
            for pid in workers:
                assert _has(_signal_mask(pid, "SigIgn"), signal.SIGINT), f"worker {pid} does not ignore SIGINT"
                caught = _signal_mask(pid, "SigCgt")
                assert not _has(caught, signal.SIGTERM) and not _has(caught, signal.SIGHUP), f"worker {pid}"
            assert _has(_signal_mask(os.getpid(), "SigCgt"), signal.SIGTERM)  # the parent's is still there
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_handler_the_program_installed_is_left_alone(small_store: Path) -> None:
    previous = {signum: signal.getsignal(signum) for signum in PARENT_SIGNALS}

    def mine(signum: int, frame: Any) -> None:
        pass

    try:
        for signum in PARENT_SIGNALS:
            signal.signal(signum, mine)
        with DALIDataLoader(small_store, batch_size=30, num_workers=2, device="cpu"):
            assert all(signal.getsignal(signum) is mine for signum in PARENT_SIGNALS)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _StuckPipeline:
    """A pipeline whose run() blocks until released: a runner thread stuck inside DALI."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def run(self) -> Any:
        self.entered.set()
        self.release.wait()
        raise StopIteration


@pytest.mark.timeout(30)
def test_stop_gives_up_on_a_stuck_pipeline_thread() -> None:
    pipe = _StuckPipeline()
    windows = WindowIterator(pipe, PipelineOutputs((), ()), (), torch.device("cpu"))
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            next(windows.windows(), None)
        except LoaderError as err:  # once released: the thread ended without a window
            errors.append(err)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert pipe.entered.wait(HANG_S), "the runner thread never called run()"
    try:
        assert windows.stop(timeout=0.3) is False  # gave up: run() cannot return before the release below
        assert windows.broken  # the pipeline must be abandoned, not reused or shut down
        assert windows.stop(timeout=0.3) is False  # and stays so, without waiting again
    finally:
        pipe.release.set()
        consumer.join(5)
    assert [type(err) for err in errors] == [LoaderError]


@pytest.mark.timeout(60)
def test_closing_a_pipeline_dali_cannot_stop_kills_its_workers(small_store: Path) -> None:
    """A process died holding DALI's task-queue lock, so DALI's own close waits for ever: ours gives up."""
    with DALIDataLoader(small_store, batch_size=30, num_workers=2, start_method="fork", device="cpu") as loader:
        next(iter(loader))
        pipe = loader._pipe
        loader._stop_runner()
        procs = worker_processes(pipe)
        holder = os.fork()
        if holder == 0:
            pipe._py_pool.pool._general_task_queue.lock.acquire()
            os._exit(0)
        os.waitpid(holder, 0)
        assert close_pipeline(pipe, timeout=0.5) is False  # DALI's own close would wait on the lock for ever
        assert [proc.exitcode for proc in procs] == [-signal.SIGKILL] * 2
        pipe._py_pool.close()  # what DALI does again at collection and exit: must return (the timeout catches a hang)
        loader._abandoned.append(pipe)  # the loader keeps it referenced, never shuts it down
        loader._pipe = None


@pytest.mark.timeout(30)
def test_a_process_a_worker_forks_is_not_armed_as_a_worker() -> None:
    """Only the workers die with the training process: what a worker forks in turn has its own parent."""
    from dali_alchemi.pipeline.lifetime import WorkerGuard, starting_workers

    with starting_workers(WorkerGuard.for_current_thread(), fork=True):
        worker = os.fork()
        if worker == 0:  # armed by the fork hook, as a DALI worker is
            try:
                grandchild = os.fork()
                if grandchild == 0:
                    os._exit(7)
                _, status = os.waitpid(grandchild, 0)
                ignores_ctrl_c = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
                os._exit(os.waitstatus_to_exitcode(status) if ignores_ctrl_c else 3)
            finally:
                os._exit(1)
    _, status = os.waitpid(worker, 0)
    assert os.waitstatus_to_exitcode(status) == 7  # the grandchild ran to its own exit, not killed


def test_ctrl_c_while_workers_are_forked_waits_until_they_have_started() -> None:
    """Python drops a KeyboardInterrupt raised inside a fork hook: it must come after the forks instead."""
    from dali_alchemi.pipeline.lifetime import WorkerGuard, starting_workers

    reached = []
    # Ctrl-C as in a terminal, also where the suite runs with SIGINT ignored (a non-interactive shell's background job)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), starting_workers(WorkerGuard.for_current_thread(), fork=True):
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.05)  # where the handler would run, were it not held
            reached.append("after the forks")
        assert reached == ["after the forks"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, inherited)
