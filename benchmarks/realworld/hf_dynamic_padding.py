"""A Hugging Face Trainer fine-tune as users write one: a small BERT from its config, texts of
varying length tokenized up front, DataCollatorWithPadding (pads each batch to its longest),
torch_compile=True, evaluation every --eval-steps steps."""
import argparse
import random

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--max-steps", type=int, default=120)
p.add_argument("--eval-steps", type=int, default=40)
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--max-len", type=int, default=256)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--no-compile", action="store_true")
p.add_argument("--out", default="/tmp/hf_padding_out")
a = p.parse_args()

words = [f"w{i}" for i in range(2000)]
vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(words)}}
tk = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
tk.pre_tokenizer = Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]",
                                    cls_token="[CLS]", sep_token="[SEP]")

rng = random.Random(0)


class Texts(torch.utils.data.Dataset):
    def __init__(self, n):
        self.items = []
        for _ in range(n):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(8, a.max_len - 2)))
            enc = tokenizer(text, truncation=True, max_length=a.max_len)
            enc["labels"] = rng.randint(0, 1)
            self.items.append(enc)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


cfg = BertConfig(vocab_size=len(vocab), hidden_size=a.hidden, num_hidden_layers=a.layers,
                 num_attention_heads=4, intermediate_size=4 * a.hidden,
                 max_position_embeddings=a.max_len, num_labels=2)
model = BertForSequenceClassification(cfg)
args = TrainingArguments(
    output_dir=a.out, max_steps=a.max_steps, per_device_train_batch_size=a.batch_size,
    per_device_eval_batch_size=a.batch_size, eval_strategy="steps", eval_steps=a.eval_steps,
    logging_steps=20, save_strategy="no", report_to="none", torch_compile=not a.no_compile,
    use_cpu=a.device == "cpu", learning_rate=5e-5, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Texts(a.batch_size * a.max_steps),
                  eval_dataset=Texts(4 * a.batch_size),
                  data_collator=DataCollatorWithPadding(tokenizer))
trainer.train()
