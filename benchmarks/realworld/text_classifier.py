"""Text classification with a pure-Python tokenizer in the Dataset (num_workers=0).

Written the way many small NLP training scripts are: sentences are generated from a fixed
seed, ``__getitem__`` lower-cases, splits with a regex, applies byte-pair-style merges in
Python and maps pieces to ids; ``collate_fn`` pads in Python. The model is a small
Transformer encoder with mean pooling. ``--fixed`` is the hand fix: tokenize in worker
processes (``num_workers`` from ``os.cpu_count()``: 12 on 16 cores), persistent workers,
pinned memory and non-blocking copies on CUDA.

    python text_classifier.py --steps 50
    python text_classifier.py --steps 50 --fixed
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WORDS = [
    'the', 'a', 'an', 'model', 'data', 'train', 'loss', 'step', 'layer', 'token', 'speed',
    'memory', 'kernel', 'host', 'fast', 'slow', 'batch', 'graph', 'tensor', 'python',
    'worker', 'queue', 'cache', 'disk', 'network', 'cluster', 'node', 'gradient', 'optimizer',
    'learning', 'rate', 'schedule', 'epoch', 'sample', 'label', 'class', 'review', 'movie',
    'great', 'bad', 'terrible', 'wonderful', 'boring', 'exciting', 'plot', 'actor', 'scene',
    'music', 'ending', 'story',
]
PAD, UNK = 0, 1
TOKEN_RE = re.compile(r"[a-z]+|[0-9]+|[^\sa-z0-9]")


def make_sentences(n: int, seed: int = 0) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(24, 96))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        text = " ".join(words).capitalize() + rng.choice([".", "!", "?"])
        out.append((text, int("great" in words or "wonderful" in words)))
    return out


class BPETokenizer:
    """A toy byte-pair tokenizer: characters, then greedy merges learned from a corpus."""

    def __init__(self, corpus: list[str], num_merges: int = 200) -> None:
        counts: dict[tuple[str, ...], int] = {}
        for text in corpus:
            for word in TOKEN_RE.findall(text.lower()):
                key = (*word[:-1], word[-1] + "</w>")
                counts[key] = counts.get(key, 0) + 1
        self.merges: list[tuple[str, str]] = []
        for _ in range(num_merges):
            pairs: dict[tuple[str, str], int] = {}
            for word, c in counts.items():
                for pair in itertools.pairwise(word):
                    pairs[pair] = pairs.get(pair, 0) + c
            if not pairs:
                break
            best = max(pairs, key=pairs.get)
            self.merges.append(best)
            counts = {self._merge(w, best): c for w, c in counts.items()}
        pieces = sorted({p for w in counts for p in w} | {ch for t in corpus for ch in t.lower()})
        self.vocab = {p: i + 2 for i, p in enumerate(pieces)}

    @staticmethod
    def _merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
        out, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
                out.append(word[i] + word[i + 1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        return tuple(out)

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in TOKEN_RE.findall(text.lower()):
            pieces = (*word[:-1], word[-1] + "</w>")
            for pair in self.merges:
                pieces = self._merge(pieces, pair)
            ids.extend(self.vocab.get(p, UNK) for p in pieces)
        return ids


class ReviewDataset(Dataset):
    def __init__(self, samples, tokenizer: BPETokenizer, max_len: int) -> None:
        self.samples, self.tokenizer, self.max_len = samples, tokenizer, max_len

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx):
        text, label = self.samples[idx]
        return self.tokenizer.encode(text)[: self.max_len], label


def collate(batch):
    longest = max(len(ids) for ids, _ in batch)
    padded = [ids + [PAD] * (longest - len(ids)) for ids, _ in batch]
    return torch.tensor(padded), torch.tensor([label for _, label in batch])


class Classifier(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 2)

    def forward(self, ids):
        mask = ids != PAD
        h = self.encoder(self.embed(ids), src_key_padding_mask=~mask)
        h = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return self.head(h)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-samples", type=int, default=20000)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--merges", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--fixed", action="store_true", help="the hand fix: tokenize in workers")
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    samples = make_sentences(args.num_samples)
    tokenizer = BPETokenizer([t for t, _ in samples[:500]], args.merges)
    dataset = ReviewDataset(samples, tokenizer, args.max_len)
    workers = args.num_workers
    if args.fixed:
        workers = max(1, (os.cpu_count() or 1) * 3 // 4)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                        num_workers=workers, drop_last=True,
                        persistent_workers=args.fixed and workers > 0,
                        pin_memory=args.fixed and device.type == "cuda")
    non_blocking = args.fixed and device.type == "cuda"
    model = Classifier(len(tokenizer.vocab) + 2, args.dim, args.layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    print(f"vocab {len(tokenizer.vocab) + 2}, {len(dataset)} samples, workers {workers}")

    step, t0 = 0, time.time()
    while step < args.steps:
        for ids, labels in loader:
            ids = ids.to(device, non_blocking=non_blocking)
            labels = labels.to(device, non_blocking=non_blocking)
            loss = criterion(model(ids), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.log_interval == 0 or step == 1:
                print(f"step {step} | loss {loss.item():.4f} | {time.time() - t0:.1f}s",
                      flush=True)
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
