"""Decode one large trace with three processes: this one and two forked decoders.

This process reads and inflates the file, cuts the events array into pieces at the likely ends
of events (:meth:`EventChunks.pieces`) and merges; the decoders turn pieces into columns, each
getting its next piece as soon as it answers. A decoder sends back a piece's
:class:`ChunkColumns` as one msgpack message (compact columns, never pickled tables). Chunks are
merged in file order, so the tables are exactly those of a sequential load. (This process
decoding every other piece itself was slower on 2 cores: while it decodes it holds the GIL, so
the threads that fed the decoder and read its answers waited, and the decoder idled 45 % of the
time.)

A piece that does not decode (its cut fell inside a string, or the data is corrupt) stops the
sharing: what is in flight is collected, the pieces from the failed one on are handed back to
the stream, and from there every cut is checked here, where corrupt data is reported with its
byte offset. No file is written: the pieces and the results travel over pipes, and the decoders
are stopped on every way out (an error, Ctrl-C), so an interrupted load leaves nothing behind.

Measured on 2 cores (benchmarks/trace_scale.py): worth it from tens of MB of JSON on; below
:data:`PARALLEL_MIN_BYTES` the forks and the transfers cost more than they save.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from torchtriage.trace.columns import ChunkColumns, decode_chunk
from torchtriage.trace.scan import as_array
from torchtriage.trace.stream import SYNC, EventChunks, Piece

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

PARALLEL_MIN_BYTES = 48 * 2**20  # of uncompressed JSON
_BUSY_MARGIN = 0.5  # two decoders while the 1-minute load average is at most cores - this
# Bytes of JSON per piece: small enough that the last piece (decoded while the others wait)
# and the first block (scanned here before any piece) are short, large enough that the
# per-piece costs (messages, merges) stay small; 2 MB was fastest of 0.5-4 MB here.
PIECE_BYTES = 2 * 2**20
_FAILED = b""  # the decoder's answer for a piece that does not decode
_PIPE_BYTES = 2**20


def decoders(path: Path, workers: int | None) -> int:
    """How many processes decode ``path``: ``workers`` when given (at most 2), else 2 for a
    trace of :data:`PARALLEL_MIN_BYTES` or more when this process may use two cores, can fork
    and the machine is not busy (1-minute load average at most cores - 0.5), else 1. Never 2
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
    # Two decoders pay only where a second core is free: on 2 cores busy with other work (load
    # average 2.2-2.4) they took 0.97-1.04x the time of one on 54-87 MB traces, 1.3-2x on
    # 15-35 MB ones; on idle cores 0.55-0.6x.
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return 2 if busy <= cores - _BUSY_MARGIN else 1


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
    """Feed ``add`` every chunk of ``chunks`` in file order, decoded by two forked decoders
    while this process reads, inflates, cuts and merges."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    decoders: list[_Decoder] = []
    finished = False
    try:
        for _ in range(2):
            decoders.append(_Decoder(context, [end for d in decoders for end in d.ours]))
        _Dispatch(chunks, add, decoders).run()
        finished = True
    finally:
        for decoder in decoders:
            decoder.stop(now=not finished)  # an error or Ctrl-C: their work is not wanted


class _Decoder:
    """A forked decoder and this process's ends of its two pipes; ``index``: the piece it is
    decoding, if any."""

    def __init__(self, context: Any, inherited: list[Connection]) -> None:
        pieces_in, self.pieces = context.Pipe(duplex=False)  # (reading end, writing end)
        self.answers, answers_out = context.Pipe(duplex=False)
        for end in (self.pieces, answers_out):
            _widen(end)
        self.ours = [self.pieces, self.answers]
        self.process = context.Process(target=_decode_pieces,
                                       args=(pieces_in, answers_out, [*inherited, *self.ours]),
                                       daemon=True, name="torchtriage-decoder")
        self.process.start()
        pieces_in.close()
        answers_out.close()
        self.index: int | None = None

    def stop(self, now: bool) -> None:
        if now:
            self.process.terminate()
        else:
            with contextlib.suppress(OSError):
                self.pieces.send_bytes(_FAILED)  # an empty piece: stop
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        for end in self.ours:
            end.close()


class _Dispatch:
    """The pieces of one load: which decoder takes which, and the merge in order. A decoder
    gets its next piece as soon as it answers (the piece is cut ahead while they work)."""

    def __init__(self, chunks: EventChunks[ChunkColumns], add: Callable[[ChunkColumns], None],
                 decoders: list[_Decoder]) -> None:
        self.chunks, self.add, self.decoders = chunks, add, decoders
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
                free = self.free_decoder()
                if free is None:  # both gone: decode here, with checks from the first lost
                    self.ready[index] = None
                    self.settle()
                    continue
                free.pieces.send_bytes(item.text)
                free.index = index
            self.merge()
        self.settle()

    def free_decoder(self) -> _Decoder | None:
        """A decoder without a piece, waiting for an answer when both have one."""
        from multiprocessing.connection import wait

        while True:
            for decoder in self.decoders:
                if decoder.index is None and decoder.process.is_alive():
                    return decoder
            busy = [d.answers for d in self.decoders if d.index is not None]
            if not busy:
                return None
            for conn in wait(busy):
                self.collect(next(d for d in self.decoders if d.answers is conn))
            self.merge()

    def collect(self, decoder: _Decoder) -> None:
        try:
            answer = decoder.answers.recv_bytes()
        except (EOFError, OSError):  # the decoder is gone: its piece is decoded again here
            answer = _FAILED
            decoder.process.join(timeout=1)
        assert decoder.index is not None
        self.ready[decoder.index] = self.unpack.decode(answer) if answer else None
        decoder.index = None

    def merge(self) -> None:
        while self.ready.get(self.merged) is not None:
            self.add(self.ready.pop(self.merged))  # type: ignore[arg-type]
            self.held.pop(self.merged, None)
            self.merged += 1

    def settle(self) -> None:
        """Every piece so far decoded and merged, or handed back from the first that did not
        decode on (and the rest of the file cut with checks, here)."""
        for decoder in self.decoders:
            if decoder.index is not None:
                self.collect(decoder)
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


def _decode_pieces(pieces: Connection, answers: Connection,
                   parent_ends: list[Connection]) -> None:
    """The forked decoder: a piece in, its columns out (an empty message when it does not
    decode), until an empty piece or the pipe's end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loading process's to handle
    for end in parent_ends:
        end.close()
    pack = msgspec.msgpack.Encoder()
    while True:
        try:
            text = pieces.recv_bytes()
        except (EOFError, OSError):
            return
        if not text:
            return
        try:
            answer = pack.encode(decode_chunk(as_array(text, len(text))))
        except Exception:  # any failure: this piece is decoded again, with checks, there
            answer = _FAILED
        try:
            answers.send_bytes(answer)
        except OSError:
            return
