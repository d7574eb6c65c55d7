"""Token sequences for language-model pre-training, with a byte-level tokenizer.

The tokenizer is the UTF-8 bytes of the text (ids 0..255) plus a beginning-of-document id: it
needs no vocabulary file, so it works offline, at the price of ~4x longer sequences than a BPE
tokenizer on English (and more on accented text). Documents are joined with BOS and cut into
fixed windows of `seq_len + 1` tokens: the model reads the first `seq_len`, predicts the last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

BOS_ID = 256
BYTE_VOCAB_SIZE = 257  # 256 byte values + BOS


def encode_bytes(text: str) -> np.ndarray:
    """UTF-8 bytes of `text` as token ids (uint16, room for the special ids)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode_bytes(ids: Iterable[int]) -> str:
    """Inverse of `encode_bytes`; special ids are dropped, broken UTF-8 replaced."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def token_windows(documents: Iterable[str], seq_len: int) -> np.ndarray:
    """[N, seq_len + 1] uint16 windows over BOS-joined documents; the tail that does not fill a
    window is dropped. Windows do not overlap, so no token is predicted twice."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    pieces = []
    for doc in documents:
        pieces.append(np.array([BOS_ID], dtype=np.uint16))
        pieces.append(encode_bytes(doc))
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)
    width = seq_len + 1
    count = len(stream) // width
    return stream[: count * width].reshape(count, width)


# eq=False for the same reason as ImageData: tensors have no boolean ==.
@dataclass(frozen=True, eq=False)
class TextData:
    """Windows of tokens, each tagged with its natural source (language or topic file).

    `labels` is that source id: the partitioners split on it (natural-id gives one client per
    source, Dirichlet skews sources per client). `num_classes` is the vocabulary size, the width
    of the model's output, as for an image classifier.
    """

    deterministic_batches = True  # batch() is a pure function of its rows: preloads may be kept

    tokens: torch.Tensor  # int16/int32 [N, seq_len + 1]
    labels: torch.Tensor  # int64 [N]: source id
    source_names: tuple[str, ...]
    vocab_size: int = BYTE_VOCAB_SIZE

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2 or self.tokens.shape[1] < 2 or self.tokens.is_floating_point():
            raise ValueError(f"tokens must be integer [N, seq_len + 1 >= 2], got {self.tokens.dtype} "
                             f"with shape {tuple(self.tokens.shape)}")
        if self.labels.dtype != torch.int64 or self.labels.shape != (len(self.tokens),):
            raise ValueError(f"labels must be int64 [{len(self.tokens)}], got {self.labels.dtype} "
                             f"with shape {tuple(self.labels.shape)}")
        if len(self.tokens) and int(self.tokens.max()) >= self.vocab_size:
            raise ValueError(f"token id {int(self.tokens.max())} >= vocab_size {self.vocab_size}")
        if len(self.labels) and int(self.labels.max()) >= len(self.source_names):
            raise ValueError(f"source id {int(self.labels.max())} has no name in {self.source_names}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1]) - 1

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [B, T], next-token targets [B, T]), both int64."""
        rows = self.tokens[torch.as_tensor(idx, dtype=torch.int64)].to(torch.int64)
        return rows[:, :-1], rows[:, 1:]


def split_windows(windows_per_source: list[np.ndarray], names: tuple[str, ...],
                  test_every: int) -> tuple[TextData, TextData]:
    """(train, test): every `test_every`-th window of each source is held out for testing."""
    if test_every < 2:
        raise ValueError(f"test_every must be >= 2, got {test_every!r}")
    parts: dict[bool, tuple[list[np.ndarray], list[np.ndarray]]] = {True: ([], []), False: ([], [])}
    for source_id, windows in enumerate(windows_per_source):
        held_out = np.arange(len(windows)) % test_every == test_every // 2
        for is_test in (False, True):
            chosen = windows[held_out == is_test]
            parts[is_test][0].append(chosen)
            parts[is_test][1].append(np.full(len(chosen), source_id, dtype=np.int64))
    return tuple(  # type: ignore[return-value]
        TextData(tokens=torch.from_numpy(np.concatenate(parts[flag][0]).astype(np.int16)),
                 labels=torch.from_numpy(np.concatenate(parts[flag][1])), source_names=names)
        for flag in (False, True))
