"""numpy <-> Arrow on the ingest path without `pa.array`, `pa.scalar` or `.to_numpy()`: each of those imports
pandas on first use, about 0.15 s (a fifth of ingesting a 50 MB trace) for a library ingest never needs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def bitmap(flags: np.ndarray) -> pa.Buffer:
    """A boolean numpy array as an Arrow bitmap (validity or boolean data)."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def array(values: np.ndarray, type: pa.DataType | None = None, mask: np.ndarray | None = None) -> pa.Array:
    """Like `pa.array(values, type, mask=mask)` for a 1-D numeric or boolean numpy array."""
    type = type or pa.from_numpy_dtype(values.dtype)
    if pa.types.is_boolean(type):
        data = bitmap(values)
    else:
        data = pa.py_buffer(np.ascontiguousarray(values, type.to_pandas_dtype()))
    validity = bitmap(~mask) if mask is not None and mask.any() else None
    return pa.Array.from_buffers(type, len(values), [validity, data])


def strings(values: list[str]) -> pa.Array:
    """Like `pa.array(values, pa.string())` for a list of str (no None)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))


def texts(values: list[str | None]) -> pa.Array:
    """Like `pa.array(values, pa.string())` for a list of str or None."""
    missing = [v is None for v in values]
    array_ = strings(["" if v is None else v for v in values])
    if not any(missing):
        return array_
    return pa.StringArray.from_buffers(len(values), array_.buffers()[1], array_.buffers()[2],
                                       bitmap(~np.array(missing, bool)))


def to_numpy(column: pa.Array | pa.ChunkedArray, fill=None) -> np.ndarray:
    """Like `column.fill_null(fill).to_numpy()` for a numeric or boolean column (`fill` may be left out if the
    column has no nulls)."""
    arr = column.chunk(0) if isinstance(column, pa.ChunkedArray) and column.num_chunks == 1 else column
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    n, offset = len(arr), arr.offset
    validity, data = arr.buffers()[:2]
    if pa.types.is_boolean(arr.type):
        values = _bits(data, offset, n)
    else:
        dtype = np.dtype(arr.type.to_pandas_dtype())
        values = np.frombuffer(data, dtype, count=n, offset=offset * dtype.itemsize) if n else np.zeros(0, dtype)
    if arr.null_count:
        assert fill is not None, "a column with nulls needs a fill value"
        values = np.where(_bits(validity, offset, n), values, fill)
    return values


def _bits(buffer: pa.Buffer, offset: int, n: int) -> np.ndarray:
    if not n:
        return np.zeros(0, bool)
    return np.unpackbits(np.frombuffer(buffer, np.uint8), count=offset + n, bitorder="little")[offset:].view(bool)
