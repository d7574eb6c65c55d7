"""Instruction SFT: Alpaca-format records, tokenised with the model's tokenizer, loss on the
response tokens only.

    task='sft:synthetic'          the synthetic set of workloads/synthetic_instructions.py
    task='sft:<file>'             .jsonl / .json / .csv / .parquet (relative: under data-dir)
    task='sft:hf:<name>'          a Hugging Face data set (HF's cache when offline)

Options after '?', joined by '&' (as hub tasks): `label=<column>` (what partitions split on,
natural-id or Dirichlet; default `category`, one label when the column is absent),
`test-fraction=<f>` (held-out share, default 0.1, seeded), `count=<n>` (sft:synthetic's size,
default 2000). Run-config keys (algorithms/settings.py): `max-length`, `prompt-template`.

Records need `instruction` and `output`; `input` is optional. One example is
prompt + response + EOS, right-padded to the longest example (at most max-length) with an
attention mask; the targets are the next tokens of the response (and its EOS), -100 elsewhere,
so the loss, token accuracy and NLL cover the response alone.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import torch
import torch.nn.functional as F

from .task import Task

if TYPE_CHECKING:
    from adaptfl.algorithms.settings import LanguageModel

IGNORE = -100  # target of prompt and padding positions
OPTIONS = {"label", "test-fraction", "count"}
ALPACA = ("Below is an instruction that describes a task{ctx}. Write a response that "
          "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n{input}"
          "### Response:\n")
HELD_OUT_SEED = 0


def alpaca_prompt(instruction: str, text: str) -> str:
    """The Alpaca template (Taori et al. 2023), with or without an input."""
    if text:
        return ALPACA.format(ctx=", paired with an input that provides further context",
                             instruction=instruction, input=f"### Input:\n{text}\n\n")
    return ALPACA.format(ctx="", instruction=instruction, input="")


def sft_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the response tokens (targets != -100)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE)


def sft_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    keep = targets != IGNORE
    return int((logits.argmax(-1)[keep] == targets[keep]).sum()), int(keep.sum())


def response_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[B] each example's mean NLL over its response tokens (examples count alike)."""
    nll = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")
    return nll.sum(1) / (targets != IGNORE).sum(1).clamp_min(1)


@dataclass(frozen=True, eq=False)
class InstructionData:
    """One split: ids and mask [N, T], targets [N, T] (-100 off the response), labels [N]."""

    deterministic_batches = True  # batch() is a pure function of its rows: preloads may be kept

    ids: torch.Tensor
    mask: torch.Tensor
    targets: torch.Tensor
    labels: torch.Tensor
    label_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(idx, dtype=torch.int64)
        x = torch.stack((self.ids[idx], self.mask[idx]), dim=1).to(torch.int64)  # [B, 2, T]
        return x, self.targets[idx].to(torch.int64)


def parse(spec: str) -> tuple[str, dict[str, str]]:
    location, _, query = spec.removeprefix("sft:").partition("?")
    if not location:
        raise ValueError(f"task={spec!r}: nothing after 'sft:' (synthetic, a file, or hf:<name>)")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"task={spec!r}: options after '?' must be key=value pairs joined by '&'") from None
    unknown = sorted({k for k, _ in pairs} - OPTIONS)
    if unknown:
        raise ValueError(f"task={spec!r}: unknown option {unknown[0]!r}; known: {', '.join(sorted(OPTIONS))}")
    return location, dict(pairs)


def read_records(spec: str, location: str, options: dict[str, str], data_dir: str) -> list[dict[str, Any]]:
    if location == "synthetic":
        from .synthetic_instructions import synthetic_instructions

        return synthetic_instructions(_int(spec, options, "count", 2000))
    import datasets

    if location.startswith("hf:"):
        args, kwargs = (location[3:],), {}
    else:
        path = location if os.path.isabs(location) else os.path.join(data_dir, location)
        if not os.path.isfile(path):
            raise ValueError(f"task={spec!r}: {path} does not exist")
        ext = path.rsplit(".", 1)[-1]
        builder = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}.get(ext)
        if builder is None:
            raise ValueError(f"task={spec!r}: {path}: expected .jsonl, .json, .csv or .parquet")
        args, kwargs = (builder,), {"data_files": path}
    datasets.disable_progress_bars()
    try:
        loaded = datasets.load_dataset(*args, split="train", **kwargs)
    except Exception as err:  # noqa: BLE001 - any loader failure is one line about this spec
        raise ValueError(f"task={spec!r}: cannot load it ({type(err).__name__})") from None
    return list(loaded)


def _int(spec: str, options: dict[str, str], key: str, default: int) -> int:
    try:
        value = int(options.get(key, default))
    except ValueError:
        raise ValueError(f"task={spec!r}: option {key}={options[key]!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"task={spec!r}: option {key}={value} must be >= 1")
    return value


def _texts(spec: str, records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    out = []
    for i, r in enumerate(records):
        for field in ("instruction", "output"):
            if not isinstance(r.get(field), str) or not r[field].strip():
                raise ValueError(f"task={spec!r}: record {i} has no {field!r} text (Alpaca records "
                                 "need instruction and output; input is optional)")
        out.append((r["instruction"], r.get("input") or "", r["output"]))
    return out


def tokenize(spec: str, records: list[dict[str, Any]], tokenizer: Any, max_length: int,
             template: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, targets) [N, T] with T the longest example (<= max_length)."""
    rows = []
    for i, (instruction, text, output) in enumerate(_texts(spec, records)):
        if template == "chat":
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError("prompt-template='chat': the model's tokenizer has no chat "
                                 "template; use prompt-template='alpaca'")
            user = instruction + (f"\n\n{text}" if text else "")
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                                   add_generation_prompt=True)
        else:
            prompt = alpaca_prompt(instruction, text)
        prompt_ids = tokenizer(prompt, add_special_tokens=template != "chat")["input_ids"]
        if len(prompt_ids) >= max_length:
            raise ValueError(f"max-length={max_length} leaves no response token for record {i}: "
                             f"its prompt alone is {len(prompt_ids)} tokens; raise max-length")
        full = tokenizer(prompt + output, add_special_tokens=template != "chat")["input_ids"]
        full = (full + [tokenizer.eos_token_id])[:max_length]
        rows.append((full, len(prompt_ids)))
    width = max(len(f) for f, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.int32)
    mask = torch.zeros((len(rows), width), dtype=torch.int8)
    targets = torch.full((len(rows), width), IGNORE, dtype=torch.int32)
    for i, (full, prompt_len) in enumerate(rows):
        ids[i, :len(full)] = torch.tensor(full, dtype=torch.int32)
        mask[i, :len(full)] = 1
        # position t predicts token t+1: the response tokens are prompt_len .. len(full)-1
        targets[i, prompt_len - 1:len(full) - 1] = torch.tensor(full[prompt_len:], dtype=torch.int32)
    return ids, mask, targets


def load_sft_task(spec: str, data_dir: str, model: str, llm: LanguageModel) -> Task:
    """The SFT task of `spec`, tokenised with the tokenizer of `model` (an hf: model)."""
    if not model.startswith("hf:"):
        raise ValueError(f"task={spec!r} is tokenised with the model's tokenizer: it needs "
                         f"model='hf:…', got model={model!r}")
    from .causal_lm import tokenizer_of

    location, options = parse(spec)
    fraction = float(options.get("test-fraction", 0.1))
    if not 0 < fraction < 1:
        raise ValueError(f"task={spec!r}: option test-fraction={fraction} must be in (0, 1)")
    records = read_records(spec, location, options, data_dir)
    tokenizer = tokenizer_of(model, data_dir)
    ids, mask, targets = tokenize(spec, records, tokenizer, llm.max_length, llm.prompt_template)
    column = options.get("label", "category")
    values = [str(r.get(column, "")) for r in records]
    if "label" in options and any(column not in r for r in records):
        raise ValueError(f"task={spec!r}: records lack the label column {column!r}")
    names = tuple(sorted(set(values)))
    labels = torch.tensor([names.index(v) for v in values], dtype=torch.int64)
    count = math.ceil(fraction * len(records))
    if not 0 < count < len(records):
        raise ValueError(f"task={spec!r}: {len(records)} records cannot be split with "
                         f"test-fraction={fraction}")
    order = torch.randperm(len(records), generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    test, train = order[:count].sort().values, order[count:].sort().values
    train_split, test_split = (InstructionData(ids[i], mask[i], targets[i], labels[i], names)
                               for i in (train, test))
    return Task(train_split, test_split, len(tokenizer), (2, ids.shape[1]), spec, loss=sft_loss,
                accuracy=sft_accuracy, example_nll=response_nll, eval_batch_size=8)
