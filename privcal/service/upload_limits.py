"""How many bytes an uploaded ``.parquet`` file decodes to, bounded before it is read.

A parquet file declares its uncompressed size, but a dictionary-encoded text column holds
each distinct value once and every row as a small index:
48 KiB of parquet can decode to gigabytes of strings once :func:`privcal.data.files.load_array`
casts the column and makes Python strings of it. So the text (``BYTE_ARRAY``) columns are
counted, not trusted: they are read in small batches *as dictionaries* (never expanded),
and the length of every value the rows refer to is added up, stopping as soon as the
running total passes the budget. Memory stays at one batch of indices and the dictionary
(which the declared size already bounds); the other columns count 8 bytes a value. A
delta-encoded text column (``DELTA_BYTE_ARRAY``: each value a prefix of the last plus a
suffix, so also far larger decoded) cannot be read as dictionaries by pyarrow: it is
refused with a one-line way out (write it with dictionary or plain encoding, pyarrow's
default), never decoded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privcal.errors import InvalidInput

__all__ = ["parquet_decoded_size"]

#: rows per batch while counting: 64 Ki indices (256 KiB) at a time
_BATCH = 1 << 16
#: bytes counted for every value (a number; an offset or pointer besides a text)
_CELL = 8


def parquet_decoded_size(path: Path, budget: int) -> int:
    """An upper bound on the bytes ``path`` decodes to, or a number past ``budget`` as soon
    as one is known to be (the rest is not counted). A file that is not parquet raises
    whatever pyarrow raises (the caller lets the reader name the problem); a parquet file
    whose text columns cannot be counted is an :class:`InvalidInput` naming it."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    meta, schema = pf.metadata, pf.metadata.schema
    chunks = [meta.row_group(i).column(j)
              for i in range(meta.num_row_groups) for j in range(meta.num_columns)]
    declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    cells = max(sum(c.num_values for c in chunks), meta.num_rows * meta.num_columns)
    floor = max(declared, cells * _CELL)
    if floor > budget:
        return floor  # refused on what the file declares: nothing read
    text = [schema.column(j).path for j in range(meta.num_columns)
            if schema.column(j).physical_type == "BYTE_ARRAY"]
    if not text:
        return floor
    delta = sorted({c.path_in_schema for c in chunks if c.path_in_schema in text
                    and any(e.startswith("DELTA") for e in c.encodings)})
    if delta:
        raise InvalidInput(f"{path}: the text column {delta[0]!r} is delta-encoded, which "
                           "cannot be sized before it is decoded: write it with dictionary "
                           "or plain encoding (pyarrow's default)")
    # the other columns as declared (8 bytes a value at least), every value 8 bytes, and
    # the text the rows of the text columns refer to, counted
    other = sum(c.total_uncompressed_size for c in chunks if c.path_in_schema not in text)
    text_cells = sum(c.num_values for c in chunks if c.path_in_schema in text)
    total = max(other, (cells - text_cells) * _CELL) + text_cells * _CELL
    try:
        counted = pq.ParquetFile(path, read_dictionary=text)
        tops = [n for n in dict.fromkeys(pf.schema_arrow.names)
                if any(p == n or p.startswith(n + ".") for p in text)]
        for batch in counted.iter_batches(batch_size=_BATCH, columns=tops):
            total += sum(_text_bytes(col) for col in batch.columns)
            if total > budget:
                break
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InvalidInput(f"{path}: cannot read it ({type(exc).__name__}: {first})") from None
    return total


def _text_bytes(arr: Any) -> int:
    """The bytes of text the values of ``arr`` refer to, dictionaries counted per row
    (what they decode to), without decoding them; nested types are walked."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    if pa.types.is_dictionary(t):
        if not _is_text(t.value_type):
            return 0
        per_row = pc.take(pc.binary_length(arr.dictionary), arr.indices)
        return int(pc.sum(per_row).as_py() or 0)
    if _is_text(t):
        return int(pc.sum(pc.binary_length(arr)).as_py() or 0)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _text_bytes(arr.flatten())
    if pa.types.is_map(t):
        return _text_bytes(arr.keys) + _text_bytes(arr.items)
    if pa.types.is_struct(t):
        return sum(_text_bytes(f) for f in arr.flatten())
    return 0  # fixed width: counted from the metadata


def _is_text(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t))
