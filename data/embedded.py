"""The embedded default corpus: real English prose that ships with every Python install.

No network, no files to fetch: the documents are CPython's own bundled documentation — each help
topic of `pydoc_data.topics` (the text behind `help("TOPIC")`) and, for each pure-Python standard
library module, its long docstrings. About 1 MB of text in ~170 documents, ordered by a sha256 of
each document's title (a fixed, seed-free shuffle), so validation mixes both kinds.

`ensure_embedded_dataset()` builds it on first use (a SentencePiece BPE of vocab 1024 with the
reference settings, trained on the training documents) and caches it under the data root
(`$PG_DATA_DIR`, default `~/.cache/pgolf/datasets`), keyed by the corpus's own sha256, so a
different Python version gets its own dataset.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from data.build import build_dataset, selection_sha256
from data.manifest import MANIFEST_NAME, data_root

EMBEDDED_VOCAB_SIZE = 1024
EMBEDDED_VAL_FRACTION = 0.1
MIN_DOCSTRING_CHARS = 200
MIN_MODULE_CHARS = 2000
EMBEDDED_BUILD_VERSION = 1


def _module_docs(path: Path) -> str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            d = ast.get_docstring(node)
            if d and len(d) >= MIN_DOCSTRING_CHARS:
                docs.append(d)
    return "\n\n".join(docs)


def embedded_documents() -> list[str]:
    """The corpus's documents, in their fixed order (parsed once per process)."""
    return list(_embedded_documents())


@functools.cache
def _embedded_documents() -> tuple[str, ...]:
    import pydoc_data.topics

    titled: list[tuple[str, str]] = [(f"topic:{k}", v.strip()) for k, v in pydoc_data.topics.topics.items()]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(stdlib.glob("*.py")):
        text = _module_docs(p)
        if len(text) >= MIN_MODULE_CHARS:
            titled.append((f"module:{p.stem}", text))
    titled.sort(key=lambda kv: hashlib.sha256(kv[0].encode()).hexdigest())
    return tuple(text for _, text in titled if text)


def ensure_embedded_dataset(root: str | os.PathLike[str] | None = None) -> Path:
    """Return the embedded dataset folder, building it on first use."""
    docs = embedded_documents()
    digest = selection_sha256(docs)[:12]
    target = Path(root) if root else data_root()
    out = target / f"embedded-v{EMBEDDED_BUILD_VERSION}-{digest}"
    if (out / MANIFEST_NAME).is_file():
        return out
    target.mkdir(parents=True, exist_ok=True)
    val_docs = max(1, int(len(docs) * EMBEDDED_VAL_FRACTION))
    with tempfile.TemporaryDirectory(dir=target, prefix=".building-") as tmp:
        build_dataset(
            docs,
            tmp,
            val_docs=val_docs,
            vocab_size=EMBEDDED_VOCAB_SIZE,
            source={
                "kind": "embedded",
                "description": "CPython bundled documentation: pydoc_data.topics + stdlib docstrings",
                "python": sys.version.split()[0],
                "documents": len(docs),
            },
        )
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first
            if not (out / MANIFEST_NAME).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    return out
