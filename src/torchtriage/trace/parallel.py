"""Decode one large trace with two processes: this one and one forked helper.

This process reads and inflates the file, cuts the events array into pieces at the likely ends
of events (:meth:`EventChunks.pieces`) and merges the chunks in file order, so the tables are
exactly those of a sequential load. The helper has two slots of shared memory: this process
copies a piece into a free slot and sends the slot's number; the helper decodes the piece
there and sends back its :class:`ChunkColumns` as one msgpack message (compact columns, never
pickled tables). A piece that finds both slots taken is decoded here, so the helper is always
a piece or two ahead and each process decodes as many pieces as its speed allows, with no
thread: this process never waits on the helper until the file's end. (Two forked decoders
fed over pipes while this process only cut and merged was slower on 2 cores: three processes
on two cores, and each 2 MB piece copied through a pipe.)

A piece that does not decode (its cut fell inside a string, or the data is corrupt) stops the
sharing: what is in flight is collected, the pieces from the failed one on are handed back to
the stream, and from there every cut is checked here, where corrupt data is reported with its
byte offset. A helper that dies leaves its pieces to this process the same way. No file is
written: the slots are anonymous shared memory, the answers travel over a pipe, and the helper
is stopped on every way out (an error, Ctrl-C), so an interrupted load leaves nothing behind.

Measured on 2 cores, in 1 MB pieces: 0.62-0.91x the time of one process on the 10-54 MB
shared traces (10 MB: 0.91x, 54 MB: 0.62x). The helper's working set is a second one, though:
a 10 MB trace's peak went from 12 MB to 20 MB. Below :data:`PARALLEL_MIN_BYTES` (12 MiB) the
few milliseconds saved are not worth it, and the peak stays within twice the JSON.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import struct
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from torchtriage.trace.columns import ChunkColumns, decode_chunk
from torchtriage.trace.scan import as_array, leading_separators
from torchtriage.trace.stream import SYNC, EventChunks, Piece

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

PARALLEL_MIN_BYTES = 12 * 2**20  # of uncompressed JSON
_BUSY_MARGIN = 0.5  # two processes while machine_load() is at most cores - this
# Bytes of JSON per piece: small enough that the last piece (decoded while the other process
# waits) and the first block (scanned here before any piece) are short and that each
# process's working set stays small, large enough that the per-piece costs (messages,
# merges) stay small. 1 MB pieces loaded 15-87 MB traces as fast as 2 MB ones or faster (4 MB:
# 1.2-1.3x slower) with a third less peak memory on 15-35 MB ones (2026-12-04).
PIECE_BYTES = 2**20
# A slot holds a piece of up to twice that (with its brackets); a larger one, rare (a block
# without an event's end), is decoded here.
SLOT_BYTES = 2 * PIECE_BYTES + 2
_FAILED = b""  # the helper's answer for a piece that does not decode (and the stop order)
_ORDER = struct.Struct("<BQ")  # slot, bytes
_PIPE_BYTES = 2**20


def decoders(path: Path, workers: int | None) -> int:
    """How many processes decode ``path``: ``workers`` when given (at most 2), else 2 for a
    trace of :data:`PARALLEL_MIN_BYTES` or more when this process may use two cores, can fork
    and the machine is not busy (:func:`machine_load` at most cores - 0.5), else 1. Never 2
    where this process cannot fork children (no fork; a daemonic process, such as a pool's)."""
    if workers is not None and workers < 2:
        return 1
    if workers is None and raw_size(path) < PARALLEL_MIN_BYTES:  # (a small trace never
        return 1  # imports multiprocessing)
    import multiprocessing

    if ("fork" not in multiprocessing.get_all_start_methods()
            or multiprocessing.current_process().daemon):
        return 1
    if workers is not None:
        return 2
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    if cores < 2:
        return 1
    # Two processes pay only where a second core is free: with both cores of 2 busy with other
    # work they took 0.99-1.02x the time of one on 35-54 MB traces and 1.22x on 15 MB; on idle
    # cores 0.70-0.83x.
    return 2 if machine_load() <= cores - _BUSY_MARGIN else 1


def machine_load() -> float:
    """How many cores other work takes as a load starts: the lesser of the 1-minute load
    average and the tasks runnable right now besides this one (``/proc/loadavg``'s fourth
    field). The average lags: for a minute after a training run or a build has ended it still
    says the cores are taken, and a load would decode in one process for nothing; a moment's
    count alone would miss work that only pauses."""
    average = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    now = _runnable_now()
    return average if now is None else min(average, max(now - 1, 0))


def _runnable_now() -> int | None:
    """Tasks runnable at this instant, this one included (Linux); None elsewhere."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def raw_size(path: Path) -> int:
    """The file's size uncompressed, as far as it says: a gzip file's last 4 bytes hold it
    (modulo 4 GiB, of its last member), which is never less than the compressed size here."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 20:
                return size
            f.seek(-4, os.SEEK_END)
            return max(int.from_bytes(f.read(4), "little"), size)
    except OSError:
        return 0  # the load itself says what is wrong with the path


def decode_in_two(chunks: EventChunks[ChunkColumns], add: Callable[[ChunkColumns], None]
                  ) -> None:
    """Feed ``add`` every chunk of ``chunks`` in file order, decoded here and by one forked
    helper while this process reads, inflates, cuts and merges."""
    import multiprocessing

    helper = _Helper(multiprocessing.get_context("fork"))
    finished = False
    try:
        _Dispatch(chunks, add, helper).run()
        finished = True
    finally:
        helper.stop(now=not finished)  # an error or Ctrl-C: its work is not wanted


class _Helper:
    """The forked decoder: two slots of shared memory that this process copies pieces into
    (no pipe carries a piece), a pipe of orders (slot, length) to it and one of answers
    back. ``queue``: the pieces handed to it, (index, slot), in the order given."""

    def __init__(self, context: Any) -> None:
        self.slots = [mmap.mmap(-1, SLOT_BYTES) for _ in range(2)]  # shared with the fork
        orders_in, self.orders = context.Pipe(duplex=False)  # (reading end, writing end)
        self.answers, answers_out = context.Pipe(duplex=False)
        _widen(answers_out)
        self.process = context.Process(target=_decode_slots,
                                       args=(self.slots, orders_in, answers_out,
                                             [self.orders, self.answers]),
                                       daemon=True, name="torchtriage-decoder")
        self.process.start()
        orders_in.close()
        answers_out.close()
        self.queue: deque[tuple[int, int]] = deque()
        self.free = [1, 0]
        self.alive = True

    def give(self, index: int, piece: Piece, ahead: int = 2) -> bool:
        """Hand ``piece`` over as a JSON array in a free slot; False when none is free, the
        helper already has ``ahead`` pieces, the piece does not fit in a slot, or the helper
        is gone."""
        text = piece.text
        start = leading_separators(text)
        size = len(text) - start + 2
        if not (self.free and len(self.queue) < ahead and self.alive and size <= SLOT_BYTES):
            return False
        slot = self.free.pop()
        buffer = self.slots[slot]
        buffer[0] = 91  # [
        buffer[1:size - 1] = memoryview(text)[start:]
        buffer[size - 1] = 93  # ]
        try:
            self.orders.send_bytes(_ORDER.pack(slot, size))
        except OSError:  # it is gone: this process decodes
            self.free.append(slot)
            self.alive = False
            return False
        self.queue.append((index, slot))
        return True

    def answer(self) -> tuple[int, bytes]:
        """The next answer (waiting for it): the piece's index and its columns as msgpack,
        or an empty message when it did not decode, or the helper is gone."""
        index, slot = self.queue.popleft()
        try:
            answer = self.answers.recv_bytes()
        except (EOFError, OSError):  # the helper is gone: its pieces are decoded again here
            answer = _FAILED
            self.alive = False
            self.process.join(timeout=1)
        self.free.append(slot)
        return index, answer

    def stop(self, now: bool) -> None:
        if now:
            self.process.terminate()
        else:
            with contextlib.suppress(OSError):
                self.orders.send_bytes(_FAILED)  # an empty order: stop
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        for end in (self.orders, self.answers):
            end.close()
        for slot in self.slots:
            slot.close()


class _Dispatch:
    """The pieces of one load: which go to the helper and which are decoded here, and the
    merge in order. The helper is kept two pieces ahead (one in the file's last two pieces'
    worth); a piece that finds it that far ahead is decoded here, so each process takes as
    many as its speed allows."""

    def __init__(self, chunks: EventChunks[ChunkColumns], add: Callable[[ChunkColumns], None],
                 helper: _Helper) -> None:
        self.chunks, self.add, self.helper = chunks, add, helper
        self.raw_total = raw_size(chunks.path)  # (an estimate past 4 GiB of gzip)
        self.unpack = msgspec.msgpack.Decoder(ChunkColumns)
        self.held: dict[int, Piece] = {}  # pieces not merged yet, for a rewind
        self.ready: dict[int, ChunkColumns | None] = {}  # decoded, None: did not decode
        self.count = 0  # pieces and chunks numbered so far
        self.merged = 0  # chunks merged so far

    def run(self) -> None:
        for item in self.chunks.pieces():
            if item is SYNC:
                self.settle()
                continue
            index = self.count
            self.count += 1
            if not isinstance(item, Piece):  # checked and decoded by the stream, after a rewind
                self.ready[index] = item
            else:
                self.held[index] = item
                self.collect(wait=False)
                # Near the end, the helper is kept one piece ahead, not two: the last pieces
                # are then shared out, instead of this process waiting for two of them.
                near_end = self.raw_total - self.chunks.raw_bytes < 2 * PIECE_BYTES
                if not self.helper.give(index, item, ahead=1 if near_end else 2):
                    self.ready[index] = _decode(item)
            self.merge()
        self.settle()

    def collect(self, wait: bool) -> None:
        """The helper's answers that have come (all of them, ``wait``-ing, when asked)."""
        helper = self.helper
        while helper.queue and (wait or helper.answers.poll()):
            index, answer = helper.answer()
            self.ready[index] = self.unpack.decode(answer) if answer else None

    def merge(self) -> None:
        while self.ready.get(self.merged) is not None:
            self.add(self.ready.pop(self.merged))  # type: ignore[arg-type]
            self.held.pop(self.merged, None)
            self.merged += 1

    def settle(self) -> None:
        """Every piece so far decoded and merged, or handed back from the first that did not
        decode on (and the rest of the file cut with checks, here)."""
        self.collect(wait=True)
        self.merge()
        if self.merged == self.count:
            return
        failed = range(self.merged, self.count)
        import logging  # only here: a short load does not pay for importing it

        logging.getLogger(__name__).debug(
            "piece at byte %d did not decode; cutting with checks from there",
            self.held[self.merged].offset)
        self.chunks.rewind([self.held.pop(i) for i in failed])
        for i in failed:
            self.ready.pop(i, None)
        self.count = self.merged


def _widen(conn: Connection) -> None:
    """A pipe that holds a whole piece or answer (Linux allows 1 MB to anyone), so that one
    moves in a write or two instead of 64 KB at a time, a wake-up of the reader each."""
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, AttributeError, OSError):  # not Linux, or a lower limit: 64 KB it is
        pass


def _decode(piece: Piece) -> ChunkColumns | None:
    try:
        return decode_chunk(as_array(piece.text, len(piece.text)))
    except msgspec.DecodeError:  # ValidationError too: the checked path says which
        return None


def _decode_slots(slots: list[mmap.mmap], orders: Connection, answers: Connection,
                  parent_ends: list[Connection]) -> None:
    """The forked helper: an order (slot, length) in, the columns of the JSON array in that
    slot out (an empty message when it does not decode), until an empty order or the pipe's
    end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loading process's to handle
    for end in parent_ends:
        end.close()
    pack = msgspec.msgpack.Encoder()
    views = [memoryview(slot) for slot in slots]
    while True:
        try:
            order = orders.recv_bytes()
        except (EOFError, OSError):
            return
        if not order:
            return
        slot, size = _ORDER.unpack(order)
        try:
            answer = pack.encode(decode_chunk(views[slot][:size]))
        except Exception:  # any failure: this piece is decoded again, with checks, there
            answer = _FAILED
        try:
            answers.send_bytes(answer)
        except OSError:
            return
