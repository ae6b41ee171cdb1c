"""capture/trace_file.py: the trace written fast, whole or not at all."""

from __future__ import annotations

import gzip
import json

import torch
from torch.profiler import profile

from torchtriage.capture.trace_file import write_trace
from torchtriage.trace import load_trace


def test_a_real_profile_is_written_as_gzip_readers_load_and_nothing_else_is_left(tmp_path):
    with profile(record_shapes=True) as prof:
        for _ in range(50):
            torch.randn(64, 64).matmul(torch.randn(64, 64)).relu_()
    path = tmp_path / "rank0_1.1.pt.trace.json.gz"
    write_trace(prof, path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert sum(e.get("name") == "aten::matmul" for e in events) == 50
    assert len(load_trace(path).events) >= 50
