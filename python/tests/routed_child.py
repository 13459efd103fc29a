"""A child node for test_routed.py: connects to the test's node, takes the SpilledFiles it
is sent, and reports how each arrived (``python routed_child.py ADDR NAME [HOST_ID]``).

Commands (type ``cmd``): ``{"cmd": "take", "key", "file"}`` keeps the file under ``key``
and answers how it arrived and where its bytes lie; ``{"cmd": "back", "key"}`` sends it
back; ``{"cmd": "drop", "key"}`` closes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys

from handoff import Node
from handoff.memregion import region_of


async def main() -> None:
    addr, name = sys.argv[1], sys.argv[2]
    host_id = sys.argv[3] if len(sys.argv) > 3 else None
    async with Node(name, secret=b"routed", host_id=host_id) as node:
        parent = await node.connect(addr)
        print(json.dumps({"event": "ready", "channel": parent.channel, "locality": parent.locality}), flush=True)
        held: dict = {}
        while True:
            env = await node.recv()
            try:
                body = env.body
            except Exception as e:
                await env.sender.send("report", {"error": f"{type(e).__name__}: {e}"})
                continue
            if body.get("cmd") == "take":
                f = body["file"]
                held[body["key"]] = f
                view = f.view()
                await env.sender.send(
                    "report",
                    {
                        "origin": f.origin,
                        "size": f.size,
                        "digest": hashlib.sha256(view).hexdigest(),
                        "region": region_of(view),
                        "pinned": f.pin is not None,
                    },
                )
                del view
            elif body.get("cmd") == "back":
                await env.sender.send("report", {"file": held[body["key"]]})
            elif body.get("cmd") == "drop":
                held.pop(body["key"]).close()
                await env.sender.send("report", {"dropped": body["key"]})


if __name__ == "__main__":
    asyncio.run(main())
