"""What the processes sharing decoded data on one machine ask of it: where shared memory is, who is alive."""

from __future__ import annotations

import os

__all__ = ["pid_alive", "shared_memory_root"]


def shared_memory_root() -> str | None:
    """``/dev/shm`` where it exists and is writable, else ``None`` (the system's temporary folder)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
