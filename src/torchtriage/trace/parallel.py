"""Decode one large trace with two processes: this one and a forked decoder.

This process reads and inflates the file and cuts the events array into pieces at the likely
ends of events (:meth:`EventChunks.pieces`); each piece is decoded into columns either here or,
when the decoder is idle, by the decoder, which sends back its :class:`ChunkColumns` as one
msgpack message (compact columns, never pickled tables). Chunks are merged in file order, so the
tables are exactly those of a sequential load.

A piece that does not decode (its cut fell inside a string, or the data is corrupt) stops the
sharing: what is in flight is collected, the pieces from the failed one on are handed back to
the stream, and from there every cut is checked here, where corrupt data is reported with its
byte offset. No file is written: the pieces and the results travel over a pipe, and the decoder
is stopped on every way out (an error, Ctrl-C), so an interrupted load leaves nothing behind.

Measured on 2 cores (benchmarks/trace_scale.py): worth it from tens of MB of JSON on; below
:data:`PARALLEL_MIN_BYTES` the fork and the transfers cost more than they save.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec

from torchtriage.trace.columns import ChunkColumns, decode_chunk
from torchtriage.trace.stream import SYNC, EventChunks, Piece, _as_array

logger = logging.getLogger(__name__)

PARALLEL_MIN_BYTES = 48 * 2**20  # of uncompressed JSON
_FAILED = b""  # the decoder's answer for a piece that does not decode


def decoders(path: Path, workers: int | None) -> int:
    """How many processes decode ``path``: ``workers`` when given (at most 2), else 2 for a
    trace of :data:`PARALLEL_MIN_BYTES` or more when this process may use two cores and can
    fork, else 1."""
    if workers is not None:
        return max(1, min(workers, 2))
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    if cores < 2 or multiprocessing.current_process().daemon:
        return 1
    return 2 if raw_size(path) >= PARALLEL_MIN_BYTES else 1


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
    """Feed ``add`` every chunk of ``chunks`` in file order, decoded here and by a forked
    decoder."""
    context = multiprocessing.get_context("fork")
    here, there = context.Pipe()
    decoder = context.Process(target=_decoder, args=(there, here), daemon=True,
                              name="torchtriage-decoder")
    decoder.start()
    there.close()
    try:
        _Dispatch(chunks, add, here).run()
        here.send_bytes(_FAILED)  # an empty message: stop
    finally:
        here.close()
        decoder.join(timeout=1)
        if decoder.is_alive():
            decoder.terminate()
            decoder.join()


class _Dispatch:
    """The pieces of one load: which is decoded where, and the merge in order."""

    def __init__(self, chunks: EventChunks[ChunkColumns], add: Callable[[ChunkColumns], None],
                 conn: Connection) -> None:
        self.chunks, self.add, self.conn = chunks, add, conn
        self.unpack = msgspec.msgpack.Decoder(ChunkColumns)
        self.held: dict[int, Piece] = {}  # pieces not merged yet, for a rewind
        self.ready: dict[int, ChunkColumns | None] = {}  # decoded, None: did not decode
        self.away: int | None = None  # the piece at the decoder
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
                self.collect(block=False)
                if self.away is None:
                    self.conn.send_bytes(item.text)
                    self.away = index
                else:
                    self.ready[index] = _decode(item)
                    if self.ready[index] is None:
                        self.settle()
            self.merge()
        self.settle()

    def collect(self, block: bool) -> None:
        """The decoder's answer, if it is there (or waiting for it)."""
        if self.away is not None and (block or self.conn.poll()):
            answer = self.conn.recv_bytes()
            self.ready[self.away] = self.unpack.decode(answer) if answer else None
            self.away = None

    def merge(self) -> None:
        while self.ready.get(self.merged) is not None:
            self.add(self.ready.pop(self.merged))  # type: ignore[arg-type]
            self.held.pop(self.merged, None)
            self.merged += 1

    def settle(self) -> None:
        """Every piece so far decoded and merged, or handed back from the first that did not
        decode on (and the rest of the file cut with checks)."""
        self.collect(block=True)
        self.merge()
        if self.merged == self.count:
            return
        failed = range(self.merged, self.count)
        logger.debug("piece at byte %d did not decode; cutting with checks from there",
                     self.held[self.merged].offset)
        self.chunks.rewind([self.held.pop(i) for i in failed])
        for i in failed:
            self.ready.pop(i, None)
        self.count = self.merged


def _decode(piece: Piece) -> ChunkColumns | None:
    try:
        return decode_chunk(_as_array(piece.text, len(piece.text)))
    except msgspec.DecodeError:  # ValidationError too: the checked path says which
        return None


def _decoder(conn: Connection, parent_end: Connection) -> None:
    """The forked decoder: a piece in, its columns out (an empty message when it does not
    decode), until an empty piece or the pipe's end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loading process's to handle
    parent_end.close()
    pack = msgspec.msgpack.Encoder()
    while True:
        try:
            text = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not text:
            return
        try:
            answer = pack.encode(decode_chunk(_as_array(text, len(text))))
        except Exception:  # any failure: this piece is decoded again, with checks, there
            answer = _FAILED
        try:
            conn.send_bytes(answer)
        except OSError:
            return
