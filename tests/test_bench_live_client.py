"""The live-board bench's websocket client (``bench/live.py``): it reads frames in place, in
whatever pieces the kernel hands them over, and reads the rows out later; a wrong reader would
make the bench count rows that never came, or miss rows that did."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from bench import live


class _Transport:
    """What ``_Frames`` uses of an asyncio transport."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.protocol: Any = None
        self.closing = False

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def resume_reading(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def _frame(payload: bytes, opcode: int = 0x1, fin: bool = True, mask: bytes = b"") -> bytes:
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + payload


def _feed(frames: Any, data: bytes, piece: int) -> None:
    """``data`` into the protocol as the kernel would: ``piece`` bytes at most per read."""
    for i in range(0, len(data), piece):
        chunk = data[i : i + piece]
        view = frames.get_buffer(-1)
        n = min(len(chunk), len(view))
        view[:n] = chunk[:n]
        del view
        frames.buffer_updated(n)
        if n < len(chunk):
            _feed(frames, chunk[n:], piece)


def _patches(cycle: int, rows: int) -> bytes:
    return b"".join(
        b'<!--dlo {"patch":[%d,{"3":"%d","5":"x"},"a","b"]}-->' % (pk, cycle) for pk in range(rows)
    )


def test_the_bench_client_reads_every_row_whatever_the_pieces() -> None:
    """Messages small and large (past the 64 KiB and 16-bit lengths, and past the client's
    buffer), split at every size, masked or fragmented, between pings: each row counted once,
    under its cycle; a ping answered; nothing counted before the message is whole."""

    async def scenario() -> None:
        big = _patches(2, 3000) + b'<!--dlo {"sampled":{"broker":1}}-->'
        # Over the client's 256 KiB buffer; its last row ends the message (a message read
        # short by a byte would lose it).
        huge = _patches(3, 8999) + b'<!--dlo {"patch":[1,{"3":"3"'
        whole = b'<tr id="ch-1" data-v="x"><td data-label="In flight">4</td></tr>' + (
            b'<tr id="ch-2" data-v="y"><td data-label="In flight">0</td></tr>'
        )
        stream = (
            _frame(_patches(1, 5))
            + _frame(b"hi", opcode=0x9)
            + _frame(big)
            + _frame(huge, mask=b"\x01\x02\x03\x04")
            + _frame(whole[:30], fin=False)
            + _frame(b"", opcode=0x9)
            + _frame(whole[30:], opcode=0x0)
            + _frame(b'{"reload":{"reason":"x"}}')
        )
        assert len(huge) > 1 << 18
        for piece in (1, 7, 4096, 70_000, len(stream)):
            live.BACKLOG.items.clear()
            client = live.WsClient(0, "key")
            transport = _Transport()
            client.frames = live._Frames(client, transport, stream[:3])
            _feed(client.frames, stream[3:], piece)
            assert client.messages == 5
            live.BACKLOG.parse()
            rows = {}
            for _, cycle, n in client.received:
                rows[cycle] = rows.get(cycle, 0) + n
            assert rows == {1: 5, 2: 3000, 3: 9000, 4: 1}, piece
            assert client.notices == {
                "row patches": 12005,
                "sampled in rows": 1,
                "reload": 1,
            }
            pongs = [w for w in transport.written if w[0] == 0x8A]
            assert len(pongs) == 2  # each ping answered
            acks = b"".join(w for w in transport.written if w[0] == 0x81)
            assert acks  # what was read was acknowledged
            if piece == len(stream):
                assert client.frames.start == client.frames.end == 0

    asyncio.run(scenario())
