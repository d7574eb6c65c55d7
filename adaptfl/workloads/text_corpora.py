"""Text corpora for language-model pre-training: Debian's fortunes (offline) and C4 (network).

fortunes: Debian's `fortunes`, `fortunes-de`, `fortunes-es`, `fortunes-it` install ~8 MB of
quotes under /usr/share/games/fortunes/ (English at the top, one folder per other language,
one file per topic, quotes separated by `%` lines). The natural non-IID split is one source per
language (`task=fortunes`) or per topic file (`task=fortunes-topics`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .text_data import TextData, split_windows, token_windows

SYSTEM_FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNES_LANGUAGES = ("en", "de", "es", "it")  # folder "" holds English
FORTUNES_SEQ_LEN = 64  # bytes of context; short windows keep a CPU round cheap
FORTUNES_TEST_EVERY = 100  # ~1% of the windows held out: a fast central evaluation
C4_SEQ_LEN = 256


def fortune_files(root: Path) -> dict[tuple[str, str], Path]:
    """(language, topic) -> file. Skips the index files (.dat), the .u8 aliases, links (the
    top folder links Italian topics in), and the `off` (offensive) folder."""
    found: dict[tuple[str, str], Path] = {}
    for language in FORTUNES_LANGUAGES:
        folder = root if language == "en" else root / language
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.is_symlink() or not path.is_file() or path.suffix in (".dat", ".u8"):
                continue
            found[(language, path.name)] = path
    return found


def read_fortunes(path: Path) -> list[str]:
    """The quotes of one fortune file (separated by lines holding only `%`)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    quotes: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.strip() == "%":
            quotes.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    quotes.append("\n".join(current).strip())
    return [q for q in quotes if q]


def load_fortunes(data_dir: str = "", by: str = "language",
                  seq_len: int = FORTUNES_SEQ_LEN) -> tuple[TextData, TextData]:
    """(train, test) windows of the fortunes corpus, source = language or topic file."""
    if by not in ("language", "topic"):
        raise ValueError(f"by must be 'language' or 'topic', got {by!r}")
    root = Path(data_dir).expanduser() if data_dir else SYSTEM_FORTUNES_DIR
    return _load_fortunes_cached(str(root.resolve()), by, seq_len)


@lru_cache(maxsize=4)
def _load_fortunes_cached(root: str, by: str, seq_len: int) -> tuple[TextData, TextData]:
    files = fortune_files(Path(root))
    if not files:
        raise ValueError(f"no fortune files under {root!r}; install them with `apt-get install "
                         "fortunes fortunes-de fortunes-es fortunes-it` or pass data-dir")
    groups: dict[str, list[str]] = {}
    for (language, topic), path in files.items():
        source = language if by == "language" else f"{language}/{topic}"
        groups.setdefault(source, []).extend(read_fortunes(path))
    names = tuple(groups)
    windows = [token_windows(groups[name], seq_len) for name in names]
    if any(len(w) == 0 for w in windows):
        empty = [n for n, w in zip(names, windows, strict=True) if len(w) == 0]
        raise ValueError(f"fortune sources {empty} under {root!r} hold less than one window of "
                         f"{seq_len + 1} tokens")
    return split_windows(windows, names, FORTUNES_TEST_EVERY)


def load_c4(max_documents: int = 20000, seq_len: int = C4_SEQ_LEN) -> tuple[TextData, TextData]:
    """English C4 through HF `datasets` (streamed, first `max_documents`); needs a network.

    C4 has no natural client id: every window gets source 0, so partition it iid or Dirichlet
    (which then degenerates to size skew only).
    """
    import datasets  # heavy; only this path needs the hub

    stream = datasets.load_dataset("allenai/c4", "en", split="train", streaming=True)
    documents = [row["text"] for _, row in zip(range(max_documents), stream, strict=False)]
    windows = token_windows(documents, seq_len)
    if len(windows) < 2:
        raise ValueError(f"C4 gave {len(windows)} windows from {len(documents)} documents")
    return split_windows([windows], ("c4-en",), FORTUNES_TEST_EVERY)

