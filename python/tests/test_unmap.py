"""Large mappings are let go of off the thread that drops them (handoff.shmmap): a pooled
segment going idle, or retired, must not hold an event loop for the 20-50 ms a GiB that
tearing down its page tables and freeing its pages cost. The work still happens, and no
thread outlives it."""

from __future__ import annotations

import os
import threading
import time

from handoff import shmmap
from handoff.memfd import memfd
from handoff_pure.regions import release

SIZE = 256 << 20


def mapped(addr: int) -> bool:
    """Whether ``addr`` lies in a mapping of this process (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


def eventually(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def no_unmapper_left() -> bool:
    return not any(t.name == "handoff-munmap" for t in threading.enumerate())


def test_a_large_region_is_unmapped_by_a_thread_that_then_ends(monkeypatch):
    calls = []
    real = shmmap._munmap

    def munmap(addr, length):
        calls.append((threading.current_thread().name, length))
        return real(addr, length)

    monkeypatch.setattr(shmmap, "_munmap", munmap)
    fd = memfd(SIZE)
    region = shmmap.Region.map(fd, SIZE, write=True)
    os.close(fd)
    view = region.view()
    for off in range(0, SIZE, 4096):
        view[off] = 1  # every page touched: its page tables exist
    del view
    addr = region.addr
    assert mapped(addr) and mapped(addr + SIZE - 1)
    del region
    assert eventually(lambda: not mapped(addr) and not mapped(addr + SIZE - 1)), "still mapped"
    assert eventually(no_unmapper_left), "a handoff-munmap thread outlived its work"
    # Off this thread, a piece at a time (each holds the address space's lock briefly).
    assert {name for name, _ in calls} == {"handoff-munmap"}, calls
    assert sum(n for _, n in calls) == SIZE and max(n for _, n in calls) == shmmap.UNMAP_PIECE


def test_a_small_region_is_unmapped_at_once_on_this_thread():
    fd = memfd(1 << 20)
    region = shmmap.Region.map(fd, 1 << 20)
    os.close(fd)
    addr = region.addr
    before = threading.active_count()
    del region
    assert not mapped(addr) and threading.active_count() == before


def test_release_closes_the_descriptor_after_the_mapping_goes():
    fd = memfd(SIZE)
    held = [shmmap.Region.map(fd, SIZE, write=True)]
    addr = held[0].addr
    release(held, fd, SIZE)
    assert eventually(lambda: not mapped(addr)), "still mapped"
    assert eventually(
        lambda: not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}").find("memfd") < 0
    ), "the descriptor stayed open"
    assert eventually(no_unmapper_left)
