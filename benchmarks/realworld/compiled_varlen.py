"""A compiled Transformer text classifier fed batches padded to their own longest sentence.

Batches group sentences of similar length (Hugging Face's ``group_by_length``) and the collate
function pads each to its longest sentence (the usual ``pad_sequence`` recipe, no fixed
maximum), so almost every batch has a new sequence length.
The model is compiled with ``dynamic=False``, as performance guides suggest for fixed-shape
training: every new length fails a size guard and compiles again, and once a frame has been
compiled ``recompile_limit`` times (8) dynamo gives up and runs it eager for the rest of the
run. ``--fixed`` is the hand fix: pad every batch up to one of a few bucket lengths (64, 128,
192, 256), which compiles once per bucket.

    python compiled_varlen.py --steps 300
    python compiled_varlen.py --steps 300 --fixed
    python compiled_varlen.py --device cpu --backend eager --steps 200   # quick, no inductor
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence

BUCKETS = (64, 128, 192, 256)


class Sentences(torch.utils.data.Dataset):
    """Token sequences with a long-tailed length distribution, made from their index on the
    fly; the label is whether token 7 occurs more often than token 3."""

    def __init__(self, n: int, vocab: int, min_len: int, max_len: int) -> None:
        g = torch.Generator().manual_seed(0)
        span = max_len - min_len
        tail = torch.empty(n).exponential_(4.0 / max(span, 1), generator=g)
        self.lengths = (min_len + tail.clamp(max=span)).long()
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(1, self.vocab, (int(self.lengths[i]),), generator=g)
        return x, int((x == 7).sum() > (x == 3).sum())


class LengthGroupedBatches(torch.utils.data.Sampler):
    """Batches of similar lengths (as Hugging Face's ``group_by_length``): shuffle, sort each
    mega-batch of 50 batches by length, cut it into batches, shuffle the batches."""

    def __init__(self, lengths: torch.Tensor, batch_size: int, seed: int = 0) -> None:
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed

    def __len__(self) -> int:
        return len(self.lengths) // self.batch_size

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(len(self.lengths), generator=g)
        mega = 50 * self.batch_size
        batches = []
        for start in range(0, len(order) - self.batch_size + 1, mega):
            chunk = order[start:start + mega]
            chunk = chunk[torch.argsort(self.lengths[chunk], descending=True)]
            batches += [chunk[i:i + self.batch_size].tolist()
                        for i in range(0, len(chunk) - self.batch_size + 1, self.batch_size)]
        for i in torch.randperm(len(batches), generator=g).tolist():
            yield batches[i]


def collate(batch, buckets: tuple[int, ...] | None = None):
    xs, ys = zip(*batch, strict=True)
    x = pad_sequence(list(xs), batch_first=True, padding_value=0)
    if buckets:
        length = next((b for b in buckets if b >= x.shape[1]), x.shape[1])
        x = F.pad(x, (0, length - x.shape[1]), value=0)
    return x, torch.tensor(ys)


class Classifier(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = x == 0
        h = self.encoder(self.embed(x), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--fixed", action="store_true",
                   help="the hand fix: pad batches to a few bucket lengths")
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    data = Sentences(args.batch_size * args.steps, args.vocab, args.min_len, args.max_len)
    buckets = (*(b for b in BUCKETS if b < args.max_len), args.max_len)
    loader = torch.utils.data.DataLoader(
        data, batch_sampler=LengthGroupedBatches(data.lengths, args.batch_size),
        collate_fn=lambda b: collate(b, buckets if args.fixed else None))
    model = Classifier(args.vocab, args.dim, args.layers, args.heads).to(device)
    compiled = torch.compile(model, backend=args.backend, dynamic=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    start = time.time()
    for step, (x, y) in enumerate(loader, 1):
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.log_interval == 0:
            print(f"step {step}: loss {loss.item():.3f}, length {x.shape[1]} "
                  f"({(time.time() - start) / step * 1e3:.0f} ms/step)", flush=True)
        if step >= args.steps:
            break


if __name__ == "__main__":
    main()
