#!/usr/bin/env python3
"""How long a training loop takes to go, workers included, after each signal (the table in docs/guarantees.md).

Writes a 300-structure synthetic store (10-40 atoms) to a temporary folder, then for each signal
runs ``python train.py`` (a ``with DALIDataLoader(..., num_workers=2, device="cpu")`` loop over the
store, in a session of its own), sends the signal 0.5 s after the first batch (SIGTERM, SIGHUP and
SIGKILL to the process, SIGINT to its process group, as Ctrl-C does) and times until the process has
exited and until no process of its session is left. Prints the median and the maximum of
``--repeats`` runs; a run that has not finished after ``--cap-s`` seconds counts as "not within".

    PYTHONPATH=. python scripts/signal_exit_times.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = """
import sys
from dali_alchemi import DALIDataLoader

if __name__ == "__main__":
    with DALIDataLoader(sys.argv[1], batch_size=10, batches_per_window=2, num_workers=2, device="cpu") as loader:
        first = True
        while True:
            for batch in loader:
                if first:
                    print("iterating", flush=True)
                    first = False
"""

SIGNALS = (("SIGTERM", False), ("SIGHUP", False), ("SIGKILL", False), ("SIGINT", True))


def session(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(pid))
    return found


def one_run(script: Path, store: Path, signum: int, group: bool, cap_s: float) -> tuple[float | None, float | None]:
    """Seconds from the signal until the process exited, and until its whole session was gone."""
    proc = subprocess.Popen(
        [sys.executable, str(script), str(store)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "iterating":
        raise RuntimeError("the training loop did not start (is dali_alchemi importable?)")
    time.sleep(0.5)
    started = time.monotonic()
    (os.killpg if group else os.kill)(proc.pid, signum)
    try:
        proc.wait(cap_s)
        exited: float | None = time.monotonic() - started
    except subprocess.TimeoutExpired:
        exited = None
    while session(proc.pid) and time.monotonic() - started < cap_s:
        time.sleep(0.02)
    left = session(proc.pid)
    gone = None if left else time.monotonic() - started
    for pid in left:  # clean up after a run that failed
        os.kill(pid, signal.SIGKILL)
    if exited is None:
        proc.wait()
    return exited, gone


def summary(values: list[float | None], cap_s: float) -> str:
    if any(v is None for v in values):
        return f"not within {cap_s:.0f} s"
    done = [v for v in values if v is not None]
    return f"{statistics.median(done):.2f} s (max {max(done):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cap-s", type=float, default=30.0)
    args = parser.parse_args()
    from dali_alchemi.bench.synth import write_synthetic_store

    with tempfile.TemporaryDirectory() as tmp:
        store = write_synthetic_store(Path(tmp) / "store.zarr", 300, seed=7, min_atoms=10, max_atoms=40)
        script = Path(tmp) / "train.py"
        script.write_text(TRAIN)
        for name, group in SIGNALS:
            runs = [one_run(script, store, getattr(signal, name), group, args.cap_s) for _ in range(args.repeats)]
            target = "process group" if group else "process"
            print(
                f"{name:8s} to the {target:13s}  exited: {summary([r[0] for r in runs], args.cap_s):22s}"
                f"  workers gone: {summary([r[1] for r in runs], args.cap_s)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
