"""YAML layout spec -> frozen, validated :class:`Spec`.

A spec describes one indexer key-cache layout (DESIGN.md section 3). Every byte offset that any
generated kernel, the CPU backend or the PyTorch reference uses comes from :meth:`Spec.layout`,
the integers of two affine maps ``slot -> byte offset`` (keys in ``kv_cache``; scales in
``kv_cache``, or in their own tensor ``kv_scales`` for ``scale.placement: separate``), so the
store and the readers agree by construction.
"""
from __future__ import annotations

import hashlib
import json
import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .dtypes import KEY_DTYPES, SCALE_DTYPES, DType, query_dtype

MAX_PAGE_STRIDE = 1 << 20     # bytes: a page's padding is for alignment, not megabytes
MAX_SMEM_BYTES = 227 * 1024    # dynamic shared memory a block may opt into (sm_90, sm_100)


def simt_smem_bytes(key_dtype: str, head_dim: int, num_heads: int, next_n: int) -> int:
    """Shared memory (bytes) of one block of the portable CUDA-core paged-logits kernel: a
    request's ``next_n * num_heads`` query rows of ``head_dim`` elements (q's dtype for keys of
    ``key_dtype``, :func:`dsagen.dtypes.query_dtype`), 32 keys in fp32 and the 4 warps' partial
    sums (the launch in templates/paged_logits.cu.jinja allocates the same). A spec whose value
    exceeds :data:`MAX_SMEM_BYTES` at one of its next_n is invalid (``logits.next_n``)."""
    esize = query_dtype(KEY_DTYPES[key_dtype]).bits // 8
    return next_n * num_heads * head_dim * esize + 32 * (head_dim + 1) * 4 + 4 * next_n * 32 * 4

ARCHS = ("sm_90a", "sm_100a")
PLACEMENTS = ("page_tail", "interleaved", "separate")
ROUNDINGS = ("none", "pow2")
HEAD_DIMS = (32, 64, 128, 256)


class SpecError(ValueError):
    """A spec file is malformed (a ``ValueError``). ``str(err)`` is one line: ``FILE: FIELD:
    problem``; ``source``, ``path`` (the YAML path of the field, "" for the whole file) and
    ``message`` hold its parts."""

    def __init__(self, source: str, path: str, message: str):
        path, message = _one_line(path, 100), _one_line(message, 300)
        self.source = source
        self.path = path
        self.message = message
        super().__init__(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def _one_line(text: str, limit: int) -> str:
    """``text`` as one line of at most ``limit`` characters: line breaks and other unprintable
    characters escaped (a YAML key may hold any), the middle cut where it is longer."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit * 2 // 3] + " ... " + text[-(limit // 3 - 5):]


@dataclass(frozen=True)
class Layout:
    """Affine byte addressing of a layout.

    ``key_offset(slot) = (slot // page_size) * page_stride + (slot % page_size) * key_token_stride``
    from the start of ``kv_cache``;
    ``scale_offset(slot) = (slot // page_size) * scale_page_stride + scale_base + (slot % page_size) * scale_token_stride``
    from the start of the tensor holding the scales: ``kv_cache`` itself (``page_tail``,
    ``interleaved``: ``scale_page_stride == page_stride``), or ``kv_scales`` (``separate``:
    ``scale_page_stride = page_size * scale_bytes_per_token``, ``scale_base = 0``).
    """

    page_size: int
    page_stride: int
    key_token_stride: int
    scale_base: int
    scale_token_stride: int
    scale_page_stride: int


@dataclass(frozen=True)
class Spec:
    """A validated layout spec. Build with :func:`load_spec` or :func:`Spec.from_dict`.

    Fields (the YAML keys of the README's "Spec format"): ``name`` (an identifier of at most 100
    characters), ``description`` (one line), ``head_dim`` (elements per key: 32, 64, 128 or
    256), ``page_size`` (tokens per page, a power of two 1-256), ``key_dtype`` (``e4m3``,
    ``bf16``, ``fp16``, ``e2m1``), ``scale_dtype`` (``fp32``, ``ue8m0`` or ``none``),
    ``scale_rounding`` (``none`` or ``pow2``), ``scale_block`` (elements per scale, a power of
    two in ``[16, head_dim]``; ``head_dim`` when unscaled), ``scale_placement`` (``page_tail``,
    ``interleaved`` or ``separate``), ``num_heads`` (a multiple of 8 in 8-128), ``next_n`` (the
    query positions per request the kernels are built for, a sorted tuple of 1-4),
    ``targets`` (CUDA arches, ``sm_90a`` / ``sm_100a``), ``page_stride_bytes`` (bytes per page
    when padded, a multiple of 16, else None); ``source`` (the file it was read from, not part
    of equality or :attr:`digest`). Derived byte counts (``bytes_per_token``, ``page_bytes``,
    :attr:`layout`) are properties. The layouts and their semantics: DESIGN.md sections 2-3.
    """

    name: str
    description: str
    head_dim: int
    page_size: int
    key_dtype: str
    scale_dtype: str
    scale_rounding: str
    scale_block: int
    scale_placement: str
    num_heads: int
    next_n: tuple[int, ...]
    targets: tuple[str, ...]
    page_stride_bytes: int | None = None
    source: str = field(default="<dict>", compare=False)

    # ---- derived -------------------------------------------------------------------------
    @property
    def key(self) -> DType:
        """The key element type (:data:`dsagen.dtypes.KEY_DTYPES` entry of ``key.dtype``)."""
        return KEY_DTYPES[self.key_dtype]

    @property
    def query(self) -> DType:
        """dtype of ``q`` for this layout (e4m3 for e4m3 keys, bf16 for e2m1, else the key's)."""
        return query_dtype(self.key)

    @property
    def quantized(self) -> bool:
        """Whether the keys carry scales (``scale.dtype`` is not ``none``)."""
        return self.scale_dtype != "none"

    @property
    def key_bytes_per_token(self) -> int:
        """Bytes of one token's key row (``head_dim`` elements; e2m1 packs two per byte)."""
        return self.head_dim * self.key.bits // 8

    @property
    def scales_per_token(self) -> int:
        """Scales of one token: ``head_dim / scale.block``, 0 when unscaled."""
        return self.head_dim // self.scale_block if self.quantized else 0

    @property
    def scale_bytes_per_token(self) -> int:
        """Bytes of one token's scales (4 per fp32 scale, 1 per ue8m0 one)."""
        return self.scales_per_token * SCALE_DTYPES[self.scale_dtype]

    @property
    def bytes_per_token(self) -> int:
        """Key bytes plus scale bytes of one token (wherever the scales live)."""
        return self.key_bytes_per_token + self.scale_bytes_per_token

    @property
    def separate_scales(self) -> bool:
        """``scale.placement: separate``: the scales live in their own tensor ``kv_scales``,
        uint8 ``[num_pages, scale_page_bytes]``, and ``kv_cache`` holds only keys."""
        return self.scale_placement == "separate"

    @property
    def cache_bytes_per_token(self) -> int:
        """Bytes of one token in ``kv_cache``: ``bytes_per_token``, or only the key bytes when
        the scales are separate."""
        return self.key_bytes_per_token if self.separate_scales else self.bytes_per_token

    @property
    def page_bytes(self) -> int:
        """Bytes one page occupies in ``kv_cache`` (its stride, padding included)."""
        return self.page_stride_bytes or self.page_size * self.cache_bytes_per_token

    @property
    def scale_page_bytes(self) -> int:
        """Bytes one page occupies in ``kv_scales`` (``page_size * scale_bytes_per_token``,
        token-major, no padding) for ``separate`` placement; 0 for the other placements,
        whose scales are in ``kv_cache``."""
        return self.page_size * self.scale_bytes_per_token if self.separate_scales else 0

    @property
    def layout(self) -> Layout:
        """The byte addressing of this layout (:class:`Layout`, every field in bytes but the page
        size in tokens), from which the store, the CPU and CUDA readers (``layout.h``) and
        :func:`dsagen.reference._offsets` all address slots."""
        kb, sb, ps = self.key_bytes_per_token, self.scale_bytes_per_token, self.page_size
        if self.scale_placement == "page_tail":
            return Layout(ps, self.page_bytes, kb, ps * kb, sb, self.page_bytes)
        if self.scale_placement == "separate":
            # keys alone in kv_cache; token t of page p has its scales at (p*ps + t)*sb of kv_scales
            return Layout(ps, self.page_bytes, kb, 0, sb, ps * sb)
        # interleaved: each token holds its key bytes then its scales
        return Layout(ps, self.page_bytes, kb + sb, kb, kb + sb, self.page_bytes)

    @property
    def key_align(self) -> int:
        """Largest power of two (<= 16) dividing every key row's byte offset."""
        lay = self.layout
        token_stride = lay.key_token_stride if lay.page_size > 1 else 0   # one token per page
        g = 16
        while lay.page_stride % g or token_stride % g:
            g //= 2
        return g

    def to_dict(self) -> dict[str, Any]:
        """The spec as the nested mapping of its YAML form (``Spec.from_dict(s.to_dict()) == s``)."""
        d = {
            "name": self.name,
            "description": self.description,
            "head_dim": self.head_dim,
            "page_size": self.page_size,
            "key": {"dtype": self.key_dtype},
            "scale": {
                "dtype": self.scale_dtype,
                "rounding": self.scale_rounding,
                "block": self.scale_block,
                "placement": self.scale_placement,
            },
            "logits": {"num_heads": self.num_heads, "next_n": list(self.next_n)},
            "targets": list(self.targets),
        }
        if self.page_stride_bytes is not None:
            d["page_stride_bytes"] = self.page_stride_bytes
        return d

    @property
    def digest(self) -> str:
        """Short hash of the spec's content (not of its file name or location)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:10]

    def with_(self, **changes: Any) -> "Spec":
        """A re-validated copy with some fields changed (names as in :meth:`to_dict`, flattened).
        Raises SpecError where the result is not a valid spec."""
        d = self.to_dict()
        if self.scale_dtype == "none":
            d["scale"]["block"] = None     # no blocks: a new head_dim or scale dtype sets its default
        for k, v in changes.items():
            if k in ("key_dtype",):
                d["key"]["dtype"] = v
            elif k.startswith("scale_"):
                d["scale"][k[len("scale_"):]] = v
            elif k in ("num_heads", "next_n"):
                # next_n: a list, or one integer as in YAML (a string is not split into characters)
                iterable = hasattr(v, "__iter__") and not isinstance(v, (str, bytes, dict))
                d["logits"][k] = list(v) if k == "next_n" and iterable else v
            else:
                d[k] = v
        return Spec.from_dict(d, source=self.source)

    def summary(self) -> str:
        """One line: ``name: N B/token, M B/page`` (and the ``kv_scales`` page bytes of a
        separate spec), what ``dsagen validate`` prints."""
        s = f"{self.name}: {self.bytes_per_token} B/token, {self.page_bytes} B/page"
        if self.separate_scales:
            s += f" of keys + {self.scale_page_bytes} B/page of scales (kv_scales)"
        return s

    # ---- parsing -------------------------------------------------------------------------
    @staticmethod
    def from_dict(data: Any, source: str = "<dict>") -> "Spec":
        """Validate a parsed spec mapping (the YAML schema of the README, as Python values).

        Raises:
            SpecError: an unknown key or an impossible value; the message names ``source`` and
                the field's YAML path.
        """
        return _parse(data, source)


_SCHEMA: dict[str, Any] = {
    "name": None,
    "description": None,
    "head_dim": None,
    "page_size": None,
    "page_stride_bytes": None,
    "key": {"dtype": None},
    "scale": {"dtype": None, "rounding": None, "block": None, "placement": None},
    "logits": {"num_heads": None, "next_n": None},
    "targets": None,
}
_REQUIRED = ("name", "head_dim", "page_size", "key", "key.dtype", "logits", "logits.num_heads",
             "logits.next_n", "targets")


def _check_keys(data: Any, schema: dict, prefix: str, source: str) -> None:
    if not isinstance(data, dict):
        raise SpecError(source, prefix or "<top>", f"expected a mapping, got {type(data).__name__}")
    for k, v in data.items():
        shown = k if isinstance(k, str) else _show(k)       # (SpecError cuts a long path)
        path = f"{prefix}.{shown}" if prefix else shown
        if k not in schema:
            raise SpecError(source, path, f"unknown key (allowed here: {', '.join(schema)})")
        if isinstance(schema[k], dict):
            _check_keys(v, schema[k], path, source)


def _get(data: dict, path: str):
    cur: Any = data
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _dflt(v: Any, default: Any) -> Any:
    """``v``, or ``default`` where the field is absent (None): a given empty or false value is
    checked like any other, never silently replaced."""
    return default if v is None else v


_REPR = reprlib.Repr()                 # (its keyword arguments are Python >= 3.12)
_REPR.maxlevel, _REPR.maxtuple, _REPR.maxlist, _REPR.maxdict, _REPR.maxset = 2, 4, 4, 4, 4
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40


def _show(v: Any) -> str:
    """A short ``repr`` of a spec value for an error message: a value of any size or depth
    (e.g. nested YAML aliases, a 20000-digit integer) prints in at most about 80 characters."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    try:
        r = _REPR.repr(v)
    except ValueError:                 # an int too long for str() deeper inside
        r = f"a {type(v).__name__}"
    return r if len(r) <= 80 else r[:77] + "..."


def _int(source: str, path: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(source, path, f"expected an integer, got {_show(v)}")
    if not -2**63 <= v < 2**63:        # (every limit below is far inside; this bounds the messages)
        raise SpecError(source, path, f"{_show(v)}: out of range")
    return v


def _choice(source: str, path: str, v: Any, allowed) -> str:
    if v not in allowed:
        raise SpecError(source, path, f"{_show(v)} is not one of {', '.join(map(str, allowed))}")
    return v


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse(data: Any, source: str) -> Spec:
    _check_keys(data, _SCHEMA, "", source)
    for path in _REQUIRED:
        if _get(data, path) is None:
            raise SpecError(source, path, "required field is missing")
    name = data["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise SpecError(source, "name", f"{_show(name)} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)")
    if len(name) > 100:
        raise SpecError(source, "name", f"{len(name)} characters: at most 100 (it names files, "
                        f"namespaces and cache entries)")
    description = _dflt(data.get("description"), "")
    if not isinstance(description, str):
        raise SpecError(source, "description", "expected a string")
    description = description.strip()
    if any(not c.isprintable() for c in description) or description.endswith("\\"):
        # it is rendered into a C++ // comment of layout.h
        raise SpecError(source, "description", "must be one line of printable text, not ending "
                        "in a backslash")

    head_dim = _int(source, "head_dim", data["head_dim"])
    if head_dim not in HEAD_DIMS:
        raise SpecError(source, "head_dim", f"{head_dim} is not supported (one of {HEAD_DIMS})")
    page_size = _int(source, "page_size", data["page_size"])
    if not (_pow2(page_size) and page_size <= 256):
        raise SpecError(source, "page_size", f"{page_size} is not a power of two in [1, 256]")

    key_dtype = _choice(source, "key.dtype", _get(data, "key.dtype"), tuple(KEY_DTYPES))
    key = KEY_DTYPES[key_dtype]
    quant_default = "fp32" if key.max_value else "none"
    scale_dtype = _choice(source, "scale.dtype", _dflt(_get(data, "scale.dtype"), quant_default),
                          tuple(SCALE_DTYPES))
    rounding_default = "pow2" if scale_dtype == "ue8m0" else "none"
    rounding = _choice(source, "scale.rounding", _dflt(_get(data, "scale.rounding"), rounding_default),
                       ROUNDINGS)
    if scale_dtype == "ue8m0" and rounding != "pow2":
        raise SpecError(source, "scale.rounding",
                        f"{rounding!r}: a ue8m0 scale is a power of two; rounding must be pow2")
    placement = _choice(source, "scale.placement", _dflt(_get(data, "scale.placement"), "page_tail"),
                        PLACEMENTS)
    block_v = _get(data, "scale.block")
    block = head_dim if block_v is None else _int(source, "scale.block", block_v)

    if key.max_value and scale_dtype == "none":
        raise SpecError(source, "scale.dtype", f"key.dtype {key_dtype} is quantized and needs a scale")
    if not key.max_value and scale_dtype != "none":
        raise SpecError(source, "scale.dtype",
                        f"key.dtype {key_dtype} is stored unscaled; scale.dtype must be none")
    if scale_dtype == "none" and rounding != "none":
        raise SpecError(source, "scale.rounding", "rounding needs a scale (scale.dtype is none)")
    if scale_dtype == "none" and placement == "separate":
        raise SpecError(source, "scale.placement",
                        "'separate' (scales in their own tensor) needs a scale (scale.dtype is none)")
    if scale_dtype == "none":
        # an unscaled key has no scale blocks: a given block (a positive integer, as for any
        # spec) is recorded as head_dim, so it neither changes the digest nor divides by 0
        if block < 1:
            raise SpecError(source, "scale.block", f"{block}: must be a positive integer "
                            f"(it has no effect on an unscaled key: leave it out)")
        block = head_dim
    if scale_dtype != "none":
        if not (_pow2(block) and 16 <= block <= head_dim):
            raise SpecError(source, "scale.block",
                            f"{block} must be a power of two in [16, head_dim={head_dim}]")

    num_heads = _int(source, "logits.num_heads", _get(data, "logits.num_heads"))
    if not 8 <= num_heads <= 128 or num_heads % 8:
        raise SpecError(source, "logits.num_heads", f"{num_heads} is not a multiple of 8 in [8, 128]")
    next_n_v = _get(data, "logits.next_n")
    if isinstance(next_n_v, int) and not isinstance(next_n_v, bool):
        next_n_v = [next_n_v]
    if not isinstance(next_n_v, list) or not next_n_v:
        raise SpecError(source, "logits.next_n", "expected a non-empty list of integers")
    next_n = tuple(sorted({_int(source, "logits.next_n", n) for n in next_n_v}))
    if any(not 1 <= n <= 4 for n in next_n):
        raise SpecError(source, "logits.next_n", f"{_show(list(next_n))}: each must be in [1, 4]")

    targets_v = data["targets"]
    if isinstance(targets_v, str):
        targets_v = [targets_v]
    if not isinstance(targets_v, list) or not targets_v:
        raise SpecError(source, "targets", "expected a non-empty list")
    for t in targets_v:
        if t in ("sm_90", "sm_100"):
            raise SpecError(source, "targets",
                            f"{t!r}: use {t}a (the kernels need the arch-specific 'a' features)")
        _choice(source, "targets", t, ARCHS)
    targets = tuple(dict.fromkeys(targets_v))

    # the portable kernel keeps every query of a request in shared memory (227 KiB per block)
    for n in next_n:
        smem = simt_smem_bytes(key_dtype, head_dim, num_heads, n)
        if smem > MAX_SMEM_BYTES:
            raise SpecError(source, "logits.next_n",
                            f"next_n={n} with num_heads={num_heads}, head_dim={head_dim} {key_dtype} needs "
                            f"{smem // 1024} KiB of shared memory per block (max 227)")
    bpt = head_dim * key.bits // 8 + (head_dim // block) * SCALE_DTYPES[scale_dtype]
    what = "bytes_per_token"
    if placement == "separate":    # kv_cache holds only the keys
        bpt, what = head_dim * key.bits // 8, "key bytes per token (scales are separate)"
    stride_v = data.get("page_stride_bytes")
    stride = None
    if stride_v is not None:
        stride = _int(source, "page_stride_bytes", stride_v)
        if stride < page_size * bpt or stride % 16 or stride > MAX_PAGE_STRIDE:
            raise SpecError(source, "page_stride_bytes",
                            f"{stride} must be a multiple of 16 in [page_size * {what} "
                            f"= {page_size * bpt}, {MAX_PAGE_STRIDE}]")
    return Spec(name=name, description=description, head_dim=head_dim, page_size=page_size,
                key_dtype=key_dtype, scale_dtype=scale_dtype, scale_rounding=rounding,
                scale_block=block, scale_placement=placement, num_heads=num_heads, next_n=next_n,
                targets=targets, page_stride_bytes=stride, source=source)


def load_spec(path: str | Path) -> Spec:
    """Read and validate a YAML layout spec.

    Args:
        path: a ``.yaml`` file (see ``specs/`` and the README for the format).
    Returns:
        a frozen :class:`Spec`.
    Raises:
        SpecError: the file is missing, is not YAML, has an unknown key or an impossible value;
            the message names the file and the YAML path of the field.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(str(path), "", f"cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise SpecError(str(path), "", f"not UTF-8 text (byte {e.start})") from None
    try:
        try:
            data = yaml.load(text, Loader=_UniqueKeyLoader)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as e:         # PyYAML's constructors on odd scalars: int() of a literal
            # longer than Python reads or `!!int ''` (ValueError), `!!bool maybe`
            # (KeyError), `!!timestamp nope` (AttributeError), ...
            raise SpecError(str(path), "", f"not valid YAML: a value that does not load "
                            f"({type(e).__name__}: {e})") from None
        if data is None:
            # PyYAML's own node tells an empty stream or bare document ("" plain scalar) from
            # an explicit null (null, ~, !!null '')
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            empty = node is None or (node.value == "" and node.style is None)
            raise SpecError(str(path), "", ("the file is empty" if empty else "the document is null")
                            + " (a spec is a YAML mapping; see specs/ for the format)")
        return _parse(data, str(path))
    except yaml.YAMLError as e:
        raise SpecError(str(path), "", f"not valid YAML: {_yaml_problem(e)}") from None
    except RecursionError:
        raise SpecError(str(path), "", "nested too deeply to be a spec") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice (plain safe_load keeps
    the last value silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # `<<:` merges (their keys may be overridden)
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:          # an unhashable key: the schema check names it
                continue
            if dup:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {_show(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Plain scalars are resolved as YAML 1.2's core schema does, not as PyYAML's YAML 1.1: only
# true/false are bools (`no`, `on`, `off`, `yes` stay strings, so `dtype: no` is reported as the
# string it reads as), integers are decimal, 0o octal or 0x hex (`0100` is 100, not octal 64;
# `1:04` is a string, not the base-60 number 64), floats have no base-60 form.
_YAML12_TAGS = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML12_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def _construct_int(loader: yaml.SafeLoader, node) -> int:
    """An integer scalar as YAML 1.2 reads it: decimal (leading zeros too), ``0o`` octal, ``0x``
    hex (PyYAML reads ``0100`` as octal and ``1:04`` as base 60)."""
    v = loader.construct_scalar(node)
    base = {"0o": 8, "0x": 16}.get(v[:2], 10)
    return int(v[2:] if base != 10 else v, base)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _yaml_problem(e: "yaml.YAMLError") -> str:
    """One line from a PyYAML error: its problem and where (1-based line and column)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is None:
        return problem
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"


SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"


def shipped_spec_paths() -> list[Path]:
    """The YAML files in the repository's ``specs/`` folder (``SPECS_DIR``); each is named
    ``<its spec's name>.yaml``."""
    return sorted(SPECS_DIR.glob("*.yaml"))
