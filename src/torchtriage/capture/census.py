"""Which Python objects hold the tensors that stay alive between steps: a census from the
garbage collector's object list, taken (at most twice a run) when memory grows.

Algorithm: one pass over ``gc.get_objects()`` counts live ``torch.Tensor`` objects and those
with a ``grad_fn`` (a non-leaf result: it keeps the autograd graph of the step that made it,
with every activation that graph saved). A second pass over lists, tuples, deques and dicts
(up to ``MAX_CONTAINER`` items each) counts, per container, the tensors it holds and their
bytes (elements x element size; views count their own extent); containers of parameters only
(a module's own) and the locals of the frames on the stack are left out. The containers
holding tensors with a graph come first, the most bytes first, and are named after the
variable that refers to them: a local of a frame on the calling thread's stack (the training
loop's, since the census runs inside its optimizer step) or of an exception's traceback, a
global of ``__main__``, or an attribute of an object (found through the object's
``__dict__``); otherwise by their type.
"""

from __future__ import annotations

import gc
import os
import sys
from collections import deque

from torchtriage.diagnosis.result import TensorCensus, TensorHolder

MAX_CONTAINER = 1_000_000  # containers larger than this are not searched
TOP_HOLDERS = 3


def take_census(torch, step: int, frames: list | None = None) -> TensorCensus:
    """Count live tensors and name the containers that hold most of them (module docstring);
    ``frames``: where to look for the locals that name them first (an exception's traceback,
    innermost first), before the calling thread's stack."""
    tensor_type = torch.Tensor
    parameter_type = torch.nn.Parameter
    ids: dict[int, tuple[bool, int]] = {}  # id(tensor) -> (has a grad_fn, its bytes)
    parameters: set[int] = set()
    containers = []
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: it reads __class__, which some proxies warn on
        if issubclass(kind, tensor_type):
            try:
                ids[id(obj)] = (obj.grad_fn is not None, obj.nelement() * obj.element_size())
                if issubclass(kind, parameter_type):
                    parameters.add(id(obj))
            except Exception:  # a tensor subclass in a bad state
                continue
        elif kind in (list, tuple, deque, dict):
            containers.append(obj)
    tensors = len(ids)
    with_graph = sum(graph for graph, _ in ids.values())
    counted: list[tuple[int, int, int, object]] = []
    # a frame's locals as a dict (Python < 3.13 keeps one per frame once read): the step in
    # progress, not something kept across steps
    scopes = {id(f.f_locals) for f in _stack(frames or [])}
    for holder in containers:
        if len(holder) > MAX_CONTAINER or not holder or id(holder) in scopes:
            continue
        items = holder.values() if type(holder) is dict else holder
        n = graph = size = params = 0
        for item in items:
            found = ids.get(id(item))
            if found is not None:
                n += 1
                graph += found[0]
                size += found[1]
                params += id(item) in parameters
        if n >= 2 and params < n:  # a module's own parameters are not kept results
            counted.append((n, graph, size, holder))
    counted.sort(key=lambda x: (-(x[1] > 0), -x[2], -x[0]))  # graphs first, then bytes
    top = counted[:TOP_HOLDERS]
    names = _names([holder for *_, holder in top], frames or [])
    del containers, counted
    return TensorCensus(step=step, tensors=tensors, with_graph=with_graph, holders=[
        TensorHolder(name=names.get(id(holder)) or type(holder).__name__, tensors=n,
                     with_graph=graph, bytes=size) for n, graph, size, holder in top])


def _stack(frames: list) -> list:
    out = list(frames)
    frame = sys._getframe(2)
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def _names(holders: list[object], frames: list) -> dict[int, str]:
    """What refers to each holder by name: a frame's local, ``__main__``'s global, an
    object's attribute."""
    wanted = {id(h): h for h in holders}
    names: dict[int, str] = {}
    for frame in _stack(frames):
        if len(names) >= len(wanted):
            break
        for key, value in frame.f_locals.items():
            if id(value) in wanted and id(value) not in names:
                where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
                names[id(value)] = (f"{key} ({type(value).__name__}) in "
                                    f"{frame.f_code.co_name}() at {where}")
    main = sys.modules.get("__main__")
    for key, value in vars(main).items() if main is not None else ():
        if id(value) in wanted and id(value) not in names:
            names[id(value)] = f"{key} ({type(value).__name__}), a global of the script"
    for holder_id, holder in wanted.items():
        if holder_id in names:
            continue
        for ref in gc.get_referrers(holder):
            if type(ref) is dict and ref is not wanted:
                for key, value in ref.items():
                    if value is holder and isinstance(key, str):
                        names[holder_id] = f"attribute {key!r} ({type(holder).__name__})"
                        break
            if holder_id in names:
                break
    return names
