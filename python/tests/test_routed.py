"""Route-aware types on handoff's Python nodes (handoff.route, handoff.pins) and the
SpilledFile example: its path to a same-host process (mapped in place, under a pin), its
bytes to a remote one, the object itself in one process; the owner keeps the file until
every receiver is done or dead; hostile paths and pin updates, and the bounds."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from handoff import CapReached, Node, PinBounds, Route, RouteError, SpilledFile, pins, route
from handoff.codec import decode_body, encode_body
from helpers import eventually

SECRET = b"routed"
CHILD = Path(__file__).with_name("routed_child.py")
DATA = bytes(range(256)) * 4096  # 1 MiB


def sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


class Child:
    def __init__(self, proc: subprocess.Popen, ready: dict):
        self.proc = proc
        self.ready = ready

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
async def child(tmp_path):
    children: list = []

    async def spawn(node: Node, name: str, host_id: str | None = None) -> Child:
        args = [sys.executable, str(CHILD), node.listen_addr, name] + ([host_id] if host_id else [])
        err = open(tmp_path / f"{name}.stderr", "wb")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        line = await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
        assert line, (tmp_path / f"{name}.stderr").read_text()
        c = Child(proc, json.loads(line))
        children.append(c)
        return c

    yield spawn
    for c in children:
        c.stop()


async def ask(node: Node, peer, body: dict) -> dict:
    await peer.send("cmd", body)
    env = await node.recv(20)
    assert env.type_name == "report"
    return env.body


# ---------------------------------------------------------------- real processes


async def test_same_host_gets_the_path_maps_it_in_place_and_the_owner_keeps_the_file_until_released(child, tmp_path):
    async with Node("owner", secret=SECRET, listen="127.0.0.1:0") as a:
        c = await child(a, "near")
        assert c.ready == {"event": "ready", "channel": "shm", "locality": "same-host"}
        peer = await a.wait_for_peer("near", channel="shm")
        f = SpilledFile.write(DATA, dir=tmp_path)
        path = f.path
        report = await ask(a, peer, {"cmd": "take", "key": "x", "file": f})
        assert report["origin"] == "path" and report["size"] == len(DATA) and report["pinned"]
        assert report["digest"] == sha(DATA)
        assert report["region"] == path  # the receiver's bytes are a mapping of the file itself
        assert f.leases == 1 and a.pins.count(peer.node_id) == 1
        assert await eventually(lambda: a.pins.stats()["claimed"] == 1)

        # The receiver sends it on (here back to us): under a pin of its own, which keeps its pin on ours.
        back = (await ask(a, peer, {"cmd": "back", "key": "x"}))["file"]
        assert back.origin == "path" and back.path == path and back.pin.owner == peer.node_id
        assert back.read() == DATA

        f.close()  # the owner lets go of its handle: the receiver's pin still keeps the file
        assert await ask(a, peer, {"cmd": "drop", "key": "x"}) == {"dropped": "x"}  # and so does the chain
        await asyncio.sleep(0.5)
        assert os.path.exists(path) and a.pins.count() == 1
        back.close()  # the end of the chain: every pin ends, the file goes
        assert await eventually(lambda: not os.path.exists(path), timeout=2)
        assert a.pins.count() == 0 and a.pins.stats()["released"] == 1


async def test_remote_gets_the_bytes(child, tmp_path):
    async with Node("owner", secret=SECRET, listen="127.0.0.1:0") as a:
        c = await child(a, "far", host_id="another-host")
        assert c.ready == {"event": "ready", "channel": "tcp", "locality": "remote"}
        peer = await a.wait_for_peer("far")
        with SpilledFile.write(DATA, dir=tmp_path) as f:
            report = await ask(a, peer, {"cmd": "take", "key": "x", "file": f})
            assert report["origin"] == "bytes" and report["digest"] == sha(DATA) and not report["pinned"]
            assert report["region"] != f.path
            assert f.leases == 0 and a.pins.count() == 0


async def test_a_killed_receiver_ends_its_pins_and_the_file_goes(child, tmp_path):
    async with Node("owner", secret=SECRET, listen="127.0.0.1:0") as a:
        c = await child(a, "doomed")
        peer = await a.wait_for_peer("doomed", channel="shm")
        f = SpilledFile.write(DATA, dir=tmp_path)
        path = f.path
        assert (await ask(a, peer, {"cmd": "take", "key": "x", "file": f}))["origin"] == "path"
        f.close()
        assert os.path.exists(path) and a.pins.count() == 1
        os.kill(c.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        # Its connection ends with it; DISCONNECT_GRACE (0.2 s) later its pins end.
        assert await eventually(lambda: not os.path.exists(path), timeout=2), a.pins.stats()
        assert time.monotonic() - t0 < 2 and a.pins.stats()["dropped"] == 1


async def test_pins_are_bounded_per_peer_and_a_refused_one_fails_only_that_send(child, tmp_path):
    async with Node("owner", secret=SECRET, listen="127.0.0.1:0", pins=PinBounds(max_pins_per_peer=2)) as a:
        await child(a, "greedy")
        peer = await a.wait_for_peer("greedy", channel="shm")
        files = [SpilledFile.write(DATA[:4096], dir=tmp_path) for _ in range(3)]
        for i in range(2):
            assert (await ask(a, peer, {"cmd": "take", "key": i, "file": files[i]}))["origin"] == "path"
        with pytest.raises(CapReached, match="max_pins_per_peer"):
            await peer.send("cmd", {"cmd": "take", "key": 2, "file": files[2]})
        assert files[2].leases == 0 and a.pins.count() == 2
        # Once it lets one go, there is room again on the same connection.
        assert await ask(a, peer, {"cmd": "drop", "key": 0}) == {"dropped": 0}
        assert await eventually(lambda: a.pins.count() == 1)
        assert (await ask(a, peer, {"cmd": "take", "key": 2, "file": files[2]}))["origin"] == "path"


# ---------------------------------------------------------------- one process


class Probe:
    """Records the route its encoder and decoder saw."""

    def __init__(self, value: bytes):
        self.value = value


def _probe_encode(obj: Probe, r: Route) -> tuple:
    assert Route.current() is r
    return {"locality": r.locality, "to": r.recipient.name if r.known else None}, [obj.value]


def _probe_decode(header: dict, frames: list, r: Route) -> tuple:
    assert Route.current() is r
    return header["locality"], header["to"], r.locality, r.sender.name if r.known else None, bytes(frames[0])


@pytest.fixture
def probe():
    route.register(Probe, _probe_encode, _probe_decode, name="test.Probe", same_process="encode")
    yield
    route.unregister("test.Probe")


async def test_encoders_and_decoders_see_the_route(probe):
    async with (
        Node("a", secret=SECRET, listen="127.0.0.1:0") as a,
        Node("b", secret=SECRET, listen="127.0.0.1:0", host_id="elsewhere") as b,
    ):
        peer = await a.connect(b.listen_addr)
        await peer.send("t", {"p": [Probe(b"x" * 10)]})
        assert (await b.recv(5)).body == {"p": [("remote", "b", "remote", "a", b"x" * 10)]}
        near = await b.connect(a.listen_addr)  # b's host id differs: still remote, over TCP
        await near.send("t", Probe(b"y"))
        assert (await a.recv(5)).body == ("remote", "a", "remote", "b", b"y")
    # Without a route (plain encoding), a value is encoded as for a remote peer.
    enc = encode_body({"p": Probe(b"z")})
    assert decode_body(enc.body, enc.frames) == {"p": ("remote", None, "remote", None, b"z")}


async def test_same_process_gets_the_object_itself(tmp_path):
    async with (
        Node("a", secret=SECRET, listen="127.0.0.1:0") as a,
        Node("b", secret=SECRET, listen="127.0.0.1:0") as b,
    ):
        peer = await a.connect(b.listen_addr)
        assert peer.route.locality == "same-process"
        f = SpilledFile.write(b"abc" * 1000, dir=tmp_path)
        await peer.send("t", {"f": f})
        got = (await b.recv(5)).body["f"]
        assert got is f and route.parked() == 0 and a.pins.count() == 0


async def test_an_unclaimed_pin_ends_after_the_claim_timeout():
    async with (
        Node("a", secret=SECRET, listen="127.0.0.1:0", pins=PinBounds(claim_timeout=0.3)) as a,
        Node("b", secret=SECRET, listen="127.0.0.1:0") as b,
    ):
        peer = await a.connect(b.listen_addr)
        ended = []
        ref = pins.pin(peer.route, object(), on_end=lambda: ended.append(1))
        assert ref["owner"] == a.node_id and ref["to"] == b.node_id and a.pins.count() == 1
        assert await eventually(lambda: ended == [1], timeout=2)
        assert a.pins.stats()["expired"] == 1


def _path_form(f: SpilledFile, owner: Node, to: Node, **changes) -> dict:
    st = os.stat(f.path)
    h = {
        "form": "path",
        "path": f.path,
        "size": f.size,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "host": owner.host_id,
        "lease": {"owner": owner.node_id, "pin": 1, "to": to.node_id},
    }
    h.update(changes)
    return {route.MARKER: "handoff.SpilledFile", "h": {k: v for k, v in h.items() if v is not None}, "f": []}


async def test_hostile_path_forms_fail_that_message_only(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to("/etc/passwd")
    async with (
        Node("hostile", secret=SECRET, listen="127.0.0.1:0") as a,
        Node("victim", secret=SECRET, listen="127.0.0.1:0") as b,
    ):
        peer = await a.connect(b.listen_addr)
        f = SpilledFile.write(b"q" * 5000, dir=tmp_path)
        cases = {
            "cannot open": _path_form(f, a, b, path=str(tmp_path / "nonexistent")),
            "not under a directory": _path_form(f, a, b, path="/etc/passwd"),
            "not an absolute, normalized": _path_form(f, a, b, path=str(tmp_path) + "/../" + tmp_path.name),
            "the header says 1125899906842624 bytes": _path_form(f, a, b, size=1 << 50),
            "lease is missing": _path_form(f, a, b, lease=None),
            "malformed lease": _path_form(f, a, b, lease={"owner": 1, "pin": -1, "to": b.node_id}),
            "not the file the sender meant": _path_form(f, a, b, ino=1),
            "not a regular file": _path_form(f, a, b, path=str(fifo)),
            # A symlink out of the allowed directories is resolved, then refused.
            "link' \\(it resolves to '/etc/passwd'\\) is not under": _path_form(f, a, b, path=str(link)),
            "on host 'elsewhere'": _path_form(f, a, b, host="elsewhere"),
            "unknown form": _path_form(f, a, b, form="teleport"),
            "unknown route-aware type 'no.Such'": {route.MARKER: "no.Such", "h": {}, "f": []},
        }
        for expected, body in cases.items():
            await peer.send("t", {"v": body})
            env = await b.recv(5)
            with pytest.raises(RouteError, match=expected):
                env.body
        # The node and the connection carry on.
        await peer.send("t", {"v": f})
        assert (await b.recv(5)).body["v"] is f
        assert not peer.closed and a.pins.count() == 0


async def test_bad_pin_updates_are_ignored_and_the_connection_stays(caplog):
    async with (
        Node("owner", secret=SECRET, listen="127.0.0.1:0", types=["t"]) as a,
        Node("holder", secret=SECRET, listen="127.0.0.1:0") as b,
    ):
        peer = await b.connect(a.listen_addr)
        owner_side = await a.wait_for_peer("holder")
        kept = pins.pin(owner_side.route, object())
        for body in ({"claim": "all"}, {"release": [1.5]}, [1, 2], {"steal": [1]}, {"release": list(range(5000))}):
            await peer.send(pins.TYPE_UPDATE, body)
        await peer.send(pins.TYPE_UPDATE, {"release": [kept["pin"] + 1000]})  # not one it holds
        await peer.send("t", {"still": "here"})
        assert (await a.recv(5)).body == {"still": "here"}
        assert a.pins.count() == 1 and not peer.closed
        assert "ignored (part of) a pin update" in caplog.text
        # Larger than an update can be, or with frames: ignored before its body is decoded
        # (in the read callback, where a 16-million-id list held the loop for 0.7 s).
        decoded = []
        real_on_update = a.pins.on_update
        a.pins.on_update = lambda holder, body: decoded.append(holder) or real_on_update(holder, body)
        limit = a.pins.bounds.max_update_bytes
        await peer.send(pins.TYPE_UPDATE, {"claim": [1] * (limit + 1)})
        await peer.send(pins.TYPE_UPDATE, {"claim": [], "x": bytes(4096)})
        await peer.send("t", {"still": "here"})
        assert (await a.recv(5)).body == {"still": "here"}
        assert decoded == [] and not peer.closed
        assert f"over the {limit} an update can take" in caplog.text
        assert "it carries 1 frames (an update has none)" in caplog.text
        a.pins.on_update = real_on_update
        await peer.send(pins.TYPE_UPDATE, {"release": [kept["pin"]]})
        assert await eventually(lambda: a.pins.count() == 0)


class _Frameless:
    def __init__(self, n: int):
        self.n = n


def test_a_route_aware_value_without_frames_is_decoded_in_a_body_without_frames():
    """Such a body is read in one pass (no frame to resolve): its values are decoded all the same."""
    route.register(
        _Frameless, lambda obj, r: ({"n": obj.n}, []), lambda h, frames, r: ("decoded", h["n"]), name="test.Frameless"
    )
    try:
        enc = encode_body({"x": [_Frameless(7)]})
        assert enc.frames == []
        assert decode_body(enc.body, enc.frames) == {"x": [("decoded", 7)]}
    finally:
        route.unregister("test.Frameless")
