"""Arrays born in shared memory (issue 41): NumPy's allocator in handoff's memfd arenas,
sent to a same-host node by descriptor, and kept apart from both sides' later writes."""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import ON_ENGINE
from handoff import Node, shared, shared_arrays
from helpers import eventually
from numpy._core.multiarray import get_handler_name

pytestmark = pytest.mark.skipif(not ON_ENGINE, reason="arrays are lent from arenas by the engine's send path")

MIB = 1 << 20


def inode_at(addr: int) -> int:
    """The inode of the mapping that holds ``addr`` in this process (0: anonymous)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return int(parts[4])
    raise AssertionError(f"{addr:#x} is not mapped")


def address(a) -> int:
    return np.asarray(a).__array_interface__["data"][0]


def received(env) -> np.ndarray:
    return np.frombuffer(env.body["x"], dtype=np.uint8)


async def pair(**rx_options):
    rx = await Node("rx", secret="k", listen="127.0.0.1:0", **rx_options).start()
    tx = await Node("tx", secret="k").start()
    peer = await tx.connect(rx.listen_addr)
    assert "shm" in str(peer.route)
    return rx, tx, peer


def test_the_allocator_serves_large_arrays_from_arenas_and_small_ones_from_malloc():
    with shared_arrays():
        big = np.ones(2 * MIB, dtype=np.uint8)
        small = np.ones(100, dtype=np.uint8)
        zeros = np.zeros(3 * MIB, dtype=np.uint8)
    assert get_handler_name(big) == "handoff_shared_arrays" and get_handler_name() != "handoff_shared_arrays"
    assert shared.locate(big)["len"] == 2 * MIB and shared.locate(small) is None
    assert zeros.sum() == 0 and big.sum() == 2 * MIB
    with shared_arrays(min_bytes=4 * MIB):
        below = np.ones(3 * MIB, dtype=np.uint8)
    shared.configure(min_bytes=MIB)
    assert shared.locate(below) is None
    big.resize(5 * MIB, refcheck=False)  # realloc: a new range, the bytes copied
    assert shared.locate(big) is not None and big[: 2 * MIB].sum() == 2 * MIB
    with pytest.raises(ValueError, match="min_bytes"):
        shared.configure(min_bytes=-1)


def test_threads_that_start_without_the_allocator_use_malloc():
    got = {}
    with shared_arrays():
        inside = np.ones(2 * MIB, dtype=np.uint8)
        t = threading.Thread(target=lambda: got.setdefault("a", np.ones(2 * MIB, dtype=np.uint8)))
        t.start()
        t.join()
    assert shared.locate(inside) is not None
    assert shared.locate(got["a"]) is None and get_handler_name(got["a"]) != "handoff_shared_arrays"


async def test_a_same_host_send_passes_the_arena_and_neither_side_sees_the_others_writes():
    rx, tx, peer = await pair(shm_private=True)
    try:
        with shared_arrays():
            x = np.full(4 * MIB, 1, dtype=np.uint8)
        where = shared.locate(x)
        await peer.send("t.A", {"x": x})
        env = await rx.recv(10)
        y = received(env)
        # The receiver maps the sender's arena: one physical copy, no byte copied.
        assert inode_at(address(y)) == where["inode"][1] != 0
        assert shared.locate(x)["private"] and shared.locate(x)["loans"] == 1
        assert y.flags.writeable and (y == 1).all()
        x[:] = 2  # the producer's later writes stay its own
        assert (y == 1).all()
        y[:10] = 3  # and the receiver's stay its own
        assert (x[:10] == 2).all()
        # A re-send while the first loan is out copies (the arena still holds the old bytes).
        await peer.send("t.A", {"x": x})
        y2 = received(await rx.recv(10))
        assert (y2 == 2).all() and inode_at(address(y2)) != where["inode"][1]
        assert shared.stats()["copies"] >= 1
        del y, y2, env
        gc.collect()
        assert await eventually(lambda: shared.locate(x)["loans"] == 0)
        # Released: the new bytes are written back into the arena and lent again.
        backs = shared.stats()["write_backs"]
        await peer.send("t.A", {"x": x})
        y3 = received(await rx.recv(10))
        assert (y3 == 2).all() and inode_at(address(y3)) == where["inode"][1]
        assert shared.stats()["write_backs"] == backs + 1
    finally:
        await tx.close()
        await rx.close()


async def test_over_tcp_an_arena_array_is_copied_as_any_array():
    rx = await Node("rx", secret="k", listen="127.0.0.1:0").start()
    tx = await Node("tx", secret="k", shm=False).start()
    try:
        peer = await tx.connect(rx.listen_addr)
        with shared_arrays():
            x = np.full(2 * MIB, 5, dtype=np.uint8)
        await peer.send("t.A", {"x": x})
        y = received(await rx.recv(10))
        assert (y == 5).all() and inode_at(address(y)) != shared.locate(x)["inode"][1]
        assert shared.locate(x)["loans"] == 0 and not shared.locate(x)["private"]
    finally:
        await tx.close()
        await rx.close()


async def test_a_lent_range_is_not_reused_until_released_and_realloc_never_writes_into_it():
    rx, tx, peer = await pair()
    try:
        with shared_arrays():
            x = np.full(8 * MIB, 7, dtype=np.uint8)
            await peer.send("t.A", {"x": x})
            y = received(await rx.recv(10))
            x.resize(9 * MIB, refcheck=False)  # realloc of a range already sent
            x[:] = 8
            del x
            others = [np.full(8 * MIB, 9, dtype=np.uint8) for _ in range(4)]  # no stale bytes
        assert (y == 7).all()
        lent = shared.stats()["lent_ranges"]
        assert lent >= 1
        del y, others
        gc.collect()
        assert await eventually(lambda: shared.stats()["lent_ranges"] == lent - 1)
    finally:
        await tx.close()
        await rx.close()


async def test_a_forked_child_writes_only_its_own_copy():
    rx, tx, peer = await pair()
    try:
        with shared_arrays():
            x = np.full(2 * MIB, 1, dtype=np.uint8)
            unsent = np.full(2 * MIB, 4, dtype=np.uint8)
        await peer.send("t.A", {"x": x})
        y = received(await rx.recv(10))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: writes everything it inherited
            try:
                ok = shared.locate(x) is None and shared.locate(unsent) is None
                x[:] = 66
                unsent[:] = 66
                unsent.resize(3 * MIB, refcheck=False)  # realloc of an inherited array's copy
                ok = ok and (unsent[: 2 * MIB] == 66).all()
                with shared_arrays():
                    fresh = np.ones(2 * MIB, dtype=np.uint8)
                ok = ok and shared.locate(fresh) is not None and (x == 66).all()
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"1", "the child's arrays are its own, and it has arenas of its own"
        os.close(r)
        os.waitpid(pid, 0)
        assert (x == 1).all() and (unsent == 4).all() and (y == 1).all()
    finally:
        await tx.close()
        await rx.close()


PRODUCER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    import numpy as np
    from handoff import Node, shared_arrays

    async def main():
        node = await Node("producer", secret="k").start()
        peer = await node.connect(sys.argv[1])
        with shared_arrays():
            x = np.full(16 << 20, 42, dtype=np.uint8)
        await peer.send("t.A", {"x": x})
        print("sent", flush=True)
        time.sleep(600)

    asyncio.run(main())
    """
)


async def test_a_killed_producer_leaves_what_a_peer_maps_readable(tmp_path):
    rx = await Node("rx", secret="k", listen="127.0.0.1:0", shm_private=True).start()
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER)
    child = subprocess.Popen([sys.executable, str(script), rx.listen_addr], stdout=subprocess.PIPE)
    try:
        env = await rx.recv(30)
        y = received(env)
        owner_inode = inode_at(address(y))
        assert owner_inode != 0 and (y == 42).all()
        child.kill()
        child.wait(10)
        await asyncio.sleep(0.2)
        assert (y == 42).all() and inode_at(address(y)) == owner_inode
        y[:5] = 1  # still a private, writable mapping
        del y, env
        gc.collect()
    finally:
        child.kill()
        child.wait()
        await rx.close()


FD_LIMIT = textwrap.dedent(
    """
    import asyncio, gc, os, resource
    import numpy as np
    from handoff import Node, shared, shared_arrays

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    async def main():
        rx = await Node("rx", secret="k", listen="127.0.0.1:0").start()
        tx = await Node("tx", secret="k").start()
        peer = await tx.connect(rx.listen_addr)
        with shared_arrays(min_bytes=64 << 10):
            arrays = [np.full(64 << 10, i % 251, dtype=np.uint8) for i in range(3000)]
        held = []
        for i in range(0, 3000, 50):
            await peer.send("t.A", {"x": arrays[i : i + 50]})
            held.extend((await rx.recv(30)).body["x"])
        assert all(np.frombuffer(h, dtype=np.uint8)[0] == i % 251 for i, h in enumerate(held))
        fds = len(os.listdir("/proc/self/fd"))
        stats = shared.stats()
        print(fds, stats["arenas"], stats["lends"])
        await tx.close()
        await rx.close()

    asyncio.run(main())
    """
)


def test_3000_arrays_under_a_1024_descriptor_limit(tmp_path):
    script = tmp_path / "fds.py"
    script.write_text(FD_LIMIT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    fds, arenas, lends = (int(v) for v in out.stdout.split())
    assert lends == 3000, "every array went by descriptor"
    assert arenas <= 4 and fds < 200, f"{fds} descriptors open for {arenas} arenas"


def test_the_default_allocator_takes_over_when_no_arena_can_be_made(tmp_path):
    script = tmp_path / "limit.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np
            from handoff import shared, shared_arrays
            shared.configure(max_arenas=0)
            with shared_arrays():
                a = np.ones(4 << 20)
            assert shared.locate(a) is None and a.sum() == 4 << 20
            s = shared.stats()
            assert s["refused"] == 1 and "0 arenas exist already" in s["last_refusal"], s
            print("ok")
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


FORK_WHILE_BUSY = textwrap.dedent(
    """
    import os, threading
    import numpy as np
    from handoff import shared, shared_arrays
    ext = shared._ext()
    with shared_arrays():
        a = np.full(1 << 20, 1, dtype=np.uint8)
    assert shared.locate(a) is not None
    stop = []
    def busy():  # takes the registry with the GIL let go, again and again
        while not stop:
            ext.arena_trim()
    t = threading.Thread(target=busy)
    t.start()
    for i in range(300):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                a[:] = 0xEE  # its own copy
                s = shared.stats()  # the registry answers in the child
                with shared_arrays():
                    b = np.zeros(2 << 20, dtype=np.uint8)
                if shared.locate(a) is not None or shared.locate(b) is None or s["lent_ranges"]:
                    code = 2
                # A child of the child frees its own copy.
                pid2 = os.fork()
                if pid2 == 0:
                    del a
                    os._exit(0)
                code = code or os.waitstatus_to_exitcode(os.waitpid(pid2, 0)[1])
            finally:
                os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        assert code == 0, f"fork {i}: the child exited with {code}"
        assert a[0] == 1, f"fork {i}: the child's write reached the parent's array"
    stop.append(True)
    t.join()
    print("ok")
    """
)


def test_a_child_forked_while_a_thread_uses_the_arenas_gets_its_own_copies(tmp_path):
    """The registry is taken across the fork: a child never finds it held by a thread it does
    not have (then it kept the parent's mapping, and its writes reached the parent's array)."""
    script = tmp_path / "busy.py"
    script.write_text(FORK_WHILE_BUSY)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-3000:]


NO_ROOM_FOR_THE_COPY = textwrap.dedent(
    """
    import os, resource
    import numpy as np
    from handoff import shared_arrays
    with shared_arrays():
        a = np.ones(256 << 20, dtype=np.uint8)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = int(f.read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), hard))  # no room for a copy
    pid = os.fork()
    if pid == 0:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        del a  # its range is unreadable here, but freeing it is fine
        os._exit(0)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), int(a[-1]))
    """
)


def test_a_child_without_room_for_its_copies_says_so_and_frees_them(tmp_path):
    """A forked child that gets no memory for its copy of an array: the range is made
    unreadable there (not left shared with the parent), the child says so, and freeing the
    array does not crash it (it went to ``free`` before, and the child died of SIGSEGV)."""
    script = tmp_path / "no_room.py"
    script.write_text(NO_ROOM_FOR_THE_COPY)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "1"], out.stdout + out.stderr[-3000:]
    assert "could not copy an arena of shared arrays" in out.stderr, out.stderr[-3000:]


del resource  # imported for the scripts' reader: the limit is set in the child


IDLE_FROM_ENV = """
import numpy as np
from handoff import shared

previous = shared.install()
for _ in range(3):
    a = np.ones(8 << 20, dtype=np.uint8)  # 8 MiB from an arena, then freed
    del a
print(shared.stats()["idle_populated_bytes"])
"""


@pytest.mark.parametrize(("value", "kept"), [("0", 0), (str(64 << 20), 8 << 20)])
def test_the_freed_pages_an_arena_keeps_come_from_the_environment(tmp_path, value, kept):
    """``HANDOFF_SHARED_ARRAYS_IDLE_BYTES`` bounds the freed pages kept populated for reuse
    (0: every freed range gives its pages back), as ``configure(idle_bytes=...)`` does."""
    script = tmp_path / "idle.py"
    script.write_text(IDLE_FROM_ENV)
    env = dict(os.environ, HANDOFF_SHARED_ARRAYS_IDLE_BYTES=value)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout) == kept


def test_a_bad_idle_bound_in_the_environment_is_named(tmp_path):
    script = tmp_path / "idle.py"
    script.write_text(IDLE_FROM_ENV)
    env = dict(os.environ, HANDOFF_SHARED_ARRAYS_IDLE_BYTES="lots")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    assert "HANDOFF_SHARED_ARRAYS_IDLE_BYTES='lots': expected a whole number of bytes" in out.stderr


def test_configure_after_the_environment_is_not_undone_by_the_next_install(tmp_path):
    """The environment's settings are defaults, applied at the first install: a later
    ``configure`` call holds through the installs that follow."""
    script = tmp_path / "idle.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np
            from handoff import shared

            shared.uninstall(shared.install())  # the environment's 0 applied
            shared.configure(idle_bytes=64 << 20)
            with shared.shared_arrays():
                a = np.ones(8 << 20, dtype=np.uint8)
                del a
            print(shared.stats()["idle_populated_bytes"])
            """
        )
    )
    env = dict(os.environ, HANDOFF_SHARED_ARRAYS_IDLE_BYTES="0")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout) == 8 << 20
