"""The wire protocol between the grader and a sandboxed submission: the words
of its messages, how a signature travels, and the framing and encoding of
values. Both sides (:mod:`.sandbox`, :mod:`.worker`) import it; nothing else
defines a message.

Messages. The grader first sends ``{"op": JOB}`` with the cells to run. The
worker reports ``{"op": CHECK, "key":
cell, "objects": {expr: description}, "verdict": ...}`` at each check cell and
``{"op": DONE}`` at the end; the grader then sends requests, ``{"op": CALL,
"key", "expr", "args", "kwargs"}`` or ``{"op": GETATTR, "key", "expr",
"name"}``, each answered by ``{"ok": ...}``, until it sends ``{"op":
CONTINUE}``. An object a check is given is described by its ``kind``:
``FUNCTION`` (name and signature), ``CLASS`` (also its types), ``VALUE`` (sent
as data) or ``ERROR`` (its exception's name and message).

A message is 8 bytes of length then an ``.npz`` archive (read with
``allow_pickle=False``): the entry ``__header__`` holds the JSON header, the
others hold arrays. Values travel as trees of JSON with arrays referenced by
name, so nothing the sandbox sends is ever unpickled or executed by the grader:
torch tensors, TensorFlow tensors and NumPy arrays, numbers, strings, None,
torch dtypes and shapes, lists, tuples and dicts with string keys. Any other
object travels as a reference when the sender keeps it (``keep``: the sandbox
keeps the objects it hands out, a student's module or one of its layers, and
answers calls to them by reference; see
:class:`attention_course.course.judge.Remote`), and otherwise arrives as an
:class:`Opaque` named after its type (the checks then report a wrong type).
"""

from __future__ import annotations

import collections
import inspect
import io
import json
import os
import select
import struct
import time
import zipfile

import numpy as np

# the output size limit of one reply from the sandbox
MAX_MESSAGE_BYTES = 64 * 2**20
# a message's JSON header: what json.loads turns into Python objects
MAX_HEADER_BYTES = 2**20
MAX_DIMS = 8
# the only dtypes that travel: booleans, integers and floats of at most 8 bytes
# (no objects, strings, records)
DTYPES = frozenset(
    np.dtype(t)
    for t in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)

# the worker's reports
CHECK, DONE = "check", "done"
# the grader's requests (JOB first: the cells to run, as the array "job" of
# their JSON's bytes)
JOB, CALL, GETATTR, CONTINUE = "job", "call", "getattr", "continue"
# what an object given to a check is
FUNCTION, CLASS, VALUE, ERROR = "function", "class", "value", "error"
# the array of a CHECK or DONE report that holds the outputs of the cells run
# since the last report (JSON bytes of ``[{"key": cell, "outputs": [nbformat v4
# outputs]}]``): an instructor reviews the grading run's outputs, never the
# ones the student saved. Bounded on both sides (see :func:`clean_outputs`).
OUTPUTS = "outputs"
# characters of one cell's text (streams, text/plain, tracebacks), then
# TRUNCATED
MAX_CELL_TEXT = 20_000
# one image/png, base64 (about 300 kB); a larger one is left out, with a marker
MAX_IMAGE_CHARS = 400_000
MAX_IMAGES = 8  # images kept per cell
MAX_CELL_OUTPUTS = 200  # outputs kept per cell (a loop of displays)
MAX_OUTPUT_CHARS = 4_000_000  # every output of one notebook together
TRUNCATED = (
    "\n[... cut by the grader: this cell's output is longer than "
    "{limit} characters ...]\n"
)


class WireError(Exception):
    """A message that is missing, too large, late or malformed."""


class Opaque:
    """Stands for an object of a type that does not travel (a student's result
    of an unexpected type)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def opaque(type_name: str) -> Opaque:
    return named_class(type_name, Opaque)()


_NAMED: dict[tuple[str, type], type] = {}
MAX_NAMED = 256


def named_class(type_name: str, base: type) -> type:
    """A subclass of ``base`` named after a type the sandbox reported (messages
    then read "a Linear"): one class per name, for the first :data:`MAX_NAMED`
    names; any other is named ``object`` (a reply naming a new type for each of
    its items makes no more classes)."""
    name = type_name if type_name.isidentifier() else "object"
    if (name, base) not in _NAMED and len(_NAMED) >= MAX_NAMED:
        name = "object"
    if (name, base) not in _NAMED:
        _NAMED[name, base] = type(name, (base,), {})
    return _NAMED[name, base]


def signature_of(obj) -> list | None:
    """``[[name, kind, has a default], ...]`` of a callable's parameters (a
    class: its constructor's)."""
    try:
        return [
            [p.name, int(p.kind), p.default is not inspect.Parameter.empty]
            for p in inspect.signature(obj).parameters.values()
        ]
    except (TypeError, ValueError):
        return None


def signature_from(params) -> inspect.Signature | None:
    """The signature :func:`signature_of` sent, defaults shown as None; None
    when it is malformed."""
    if not isinstance(params, list):
        return None
    try:
        return inspect.Signature(
            [
                inspect.Parameter(
                    str(n),
                    inspect._ParameterKind(int(kind)),
                    default=None if has_default else inspect.Parameter.empty,
                )
                for n, kind, has_default in params
            ]
        )
    except (TypeError, ValueError):
        return None


def encode_value(obj) -> dict:
    """A value given to a check, as the fields of its description (arrays
    inline: a description is JSON)."""
    arrays: dict = {}
    tree = encode(obj, arrays)
    return {
        "value": tree,
        "arrays": {k: v.tolist() for k, v in arrays.items()},
        "dtypes": {k: str(v.dtype) for k, v in arrays.items()},
    }


def decode_value(info: dict):
    """The value of a description made by :func:`encode_value` (its dtypes only
    :data:`DTYPES`)."""
    arrays = {}
    for k, v in info.get("arrays", {}).items():
        dtype = np.dtype(str(info.get("dtypes", {}).get(k)))
        if dtype not in DTYPES:
            raise WireError(f"an array of dtype {dtype}")
        arrays[k] = _checked(np.array(v, dtype=dtype))
    return decode(info.get("value"), arrays)


def encode(value, arrays: dict, depth: int = 0, keep=None):
    """``value`` as a JSON tree; arrays are added to ``arrays`` under fresh
    names. ``keep(obj)``: the reference tree of an object that is not data
    (``{"t": "ref", ...}``), or None to send it as opaque."""
    if depth > 20:
        return {"t": "opaque", "type": "nested"}
    if value is None or isinstance(value, (bool, str)):
        return {"t": "py", "v": value}
    if isinstance(value, (int, float)) and type(value) in (int, float):
        return {
            "t": "py",
            "v": value
            if not isinstance(value, float) or np.isfinite(value)
            else repr(value),
            "f": isinstance(value, float),
        }
    kind, arr = _as_numpy(value)
    if arr is not None:
        key = f"a{len(arrays)}"
        arrays[key] = arr
        return {"t": kind, "a": key}
    dtype = _torch_dtype_name(value)
    if dtype is not None:
        return {"t": "dtype", "v": dtype}
    # without references, any list, tuple or dict travels as data
    plain = keep is None
    if (
        type(value) in (list, tuple)
        or _is_torch_size(value)
        or plain
        and isinstance(value, (list, tuple))
    ):
        # a shape or a named tuple travels as a tuple
        kind = "list" if isinstance(value, list) else "tuple"
        return {
            "t": kind,
            "v": [encode(v, arrays, depth + 1, keep) for v in value],
        }
    if (
        type(value) is dict
        or _is_ordered_dict(value)
        or plain
        and isinstance(value, dict)
    ):
        if all(isinstance(k, str) for k in value):
            return {
                "t": "dict",
                "v": {
                    k: encode(v, arrays, depth + 1, keep)
                    for k, v in value.items()
                },
            }
    ref = keep(value) if keep is not None else None
    return (
        ref
        if ref is not None
        else {"t": "opaque", "type": type(value).__name__}
    )


def _is_torch(value, *type_names: str) -> bool:
    """Whether ``value`` is a torch object of one of these types (without
    importing torch)."""
    return type(value).__name__ in type_names and (
        type(value).__module__ or ""
    ).startswith("torch")


def is_torch_tensor(value) -> bool:
    return _is_torch(value, "Tensor", "Parameter")


def _is_torch_size(value) -> bool:
    return _is_torch(value, "Size")


def _is_ordered_dict(value) -> bool:
    """An OrderedDict (a module's ``state_dict()``) is data: a mapping of names
    to tensors."""
    return type(value) is collections.OrderedDict


def _torch_dtype_name(value) -> str | None:
    return (
        str(value).removeprefix("torch.")
        if _is_torch(value, "dtype")
        else None
    )


def array_of(value) -> np.ndarray | None:
    """``value`` as the NumPy array it would travel as (a NumPy array, a torch
    or TensorFlow tensor), or None."""
    return _as_numpy(value)[1]


def _as_numpy(value):
    if isinstance(value, np.ndarray):
        return "numpy", value if value.dtype.kind in "biuf" else None
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return "npscalar", np.asarray(value)
    module = type(value).__module__ or ""
    if is_torch_tensor(value):
        import torch

        tensor = value.detach().cpu()
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor = tensor.float()
        return (
            ("torch", tensor.numpy())
            if not tensor.is_complex()
            else (None, None)
        )
    if (
        module.startswith(("tensorflow", "keras"))
        and hasattr(value, "numpy")
        and hasattr(value, "dtype")
    ):
        try:
            return "tf", np.asarray(value.numpy())
        except Exception:  # noqa: BLE001 - a symbolic tensor has no value
            return None, None
    return None, None


def decode(tree, arrays: dict, framework_ok: bool = True, remote=None):
    """The value of an encoded tree (torch / TensorFlow tensors are rebuilt
    when ``framework_ok``); ``remote(tree)``: the object a reference stands for
    (without it, a reference arrives as opaque)."""
    kind = tree.get("t") if isinstance(tree, dict) else None
    if kind == "py":
        v = tree.get("v")
        return float(v) if tree.get("f") else v
    if kind in ("numpy", "torch", "tf", "npscalar"):
        arr = arrays[tree["a"]]
        if kind == "npscalar":
            return arr[()]
        if kind == "torch" and framework_ok:
            import torch

            return torch.from_numpy(np.array(arr))
        if kind == "tf" and framework_ok:
            import tensorflow as tf

            return tf.constant(arr)
        return np.array(arr)
    if kind in ("list", "tuple"):
        items = [decode(v, arrays, framework_ok, remote) for v in tree["v"]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {
            k: decode(v, arrays, framework_ok, remote)
            for k, v in tree["v"].items()
        }
    if kind == "dtype":
        import torch

        dtype = getattr(torch, str(tree.get("v")), None)
        if not isinstance(dtype, torch.dtype):
            raise WireError(f"unknown dtype {tree.get('v')!r}")
        return dtype
    if kind == "ref":
        return (
            remote(tree)
            if remote is not None
            else opaque(str(tree.get("type", "object")))
        )
    if kind == "opaque":
        return opaque(str(tree.get("type", "object")))
    raise WireError(f"unknown value kind {kind!r}")


def pack(header: dict, arrays: dict | None = None) -> bytes:
    buf = io.BytesIO()
    data = {f"x_{k}": v for k, v in (arrays or {}).items()}
    np.savez(
        buf,
        __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
        **data,
    )
    body = buf.getvalue()
    return struct.pack("<Q", len(body)) + body


def unpack(body: bytes) -> tuple[dict, dict]:
    """A message's header and arrays. Its archive must be uncompressed (so no
    entry is larger than the message read), its header at most
    :data:`MAX_HEADER_BYTES`, and its arrays of :data:`DTYPES` with at most
    :data:`MAX_DIMS` dimensions; anything else is refused before it is
    decoded."""
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            for info in archive.infolist():
                if (
                    info.compress_type != zipfile.ZIP_STORED
                    or info.file_size > len(body)
                ):
                    raise WireError("a compressed or oversized entry")
                if (
                    info.filename == "__header__.npy"
                    and info.file_size > MAX_HEADER_BYTES + 128
                ):
                    raise WireError(f"a header over {MAX_HEADER_BYTES} bytes")
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            header = json.loads(npz["__header__"].tobytes().decode())
            arrays = {
                k[2:]: _checked(npz[k])
                for k in npz.files
                if k.startswith("x_")
            }
    except WireError as err:
        raise WireError(f"malformed message ({err})") from None
    # anything malformed from the sandbox
    except Exception as err:  # noqa: BLE001
        raise WireError(f"malformed message ({type(err).__name__})") from None
    if not isinstance(header, dict):
        raise WireError("malformed message header")
    return header, arrays


def _checked(arr: np.ndarray) -> np.ndarray:
    if arr.dtype not in DTYPES or arr.ndim > MAX_DIMS:
        raise WireError(
            f"an array of dtype {arr.dtype} with {arr.ndim} dimensions"
        )
    return arr


def write_message(fd: int, header: dict, arrays: dict | None = None) -> None:
    data = memoryview(pack(header, arrays))
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise WireError("no reply within the time limit")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise WireError("the submission's process ended")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_message(
    fd: int, deadline: float | None = None, limit: int = MAX_MESSAGE_BYTES
) -> tuple[dict, dict]:
    (size,) = struct.unpack("<Q", _read_exactly(fd, 8, deadline))
    if size > limit:
        raise WireError(
            f"a reply of {size} bytes is over the output limit of {limit} "
            "bytes"
        )
    return unpack(_read_exactly(fd, size, deadline))


def clean_outputs(raw, room: int = MAX_OUTPUT_CHARS) -> list[dict]:
    """One cell's outputs as nbformat v4 outputs a notebook may hold, whatever
    ``raw`` is (it comes from the sandbox): streams ``stdout``/``stderr``,
    display data and results as ``text/plain`` and ``image/png`` only, errors
    with their traceback; at most :data:`MAX_CELL_TEXT` characters of text
    (then :data:`TRUNCATED`), :data:`MAX_IMAGES` images of at most
    :data:`MAX_IMAGE_CHARS` each, and ``room`` characters in all."""
    budget = {
        "text": min(MAX_CELL_TEXT, room),
        "images": MAX_IMAGES,
        "room": room,
        "cut": False,
    }
    cleaned, marked = [], False
    for item in raw[:MAX_CELL_OUTPUTS] if isinstance(raw, list) else []:
        marker = isinstance(item, dict) and str(
            item.get("text", "")
        ).startswith(TRUNCATED[:20])
        output = (
            _clean_output(item, budget)
            if isinstance(item, dict) and not marker
            else None
        )
        if output is not None and (
            output["output_type"] != "stream" or output["text"]
        ):
            cleaned.append(output)
        # once, where the text was cut (cleaned again: kept)
        if (budget["cut"] or marker) and not marked:
            cleaned.append(
                {
                    "output_type": "stream",
                    "name": "stderr",
                    "text": TRUNCATED.format(limit=min(MAX_CELL_TEXT, room)),
                }
            )
            marked = True
    return cleaned


def _text(value, budget: dict, most: int | None = None) -> str:
    """``value`` as text within the cell's budget (a list of lines is joined,
    as nbformat stores them), at most ``most`` characters."""
    if isinstance(value, list):
        value = "".join(v for v in value if isinstance(v, str))
    text = value[:most] if isinstance(value, str) else ""
    if len(text) > budget["text"]:
        text, budget["cut"] = text[: budget["text"]], True
    budget["text"] -= len(text)
    budget["room"] -= len(text)
    return text


def _image(value, budget: dict) -> str | None:
    ok = (
        isinstance(value, str)
        and len(value) <= min(MAX_IMAGE_CHARS, budget["room"])
        and budget["images"] > 0
    )
    if not ok or value.strip(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=\n"
    ):
        return None  # not base64, too large, or one image too many
    budget["images"] -= 1
    budget["room"] -= len(value)
    return value


def _clean_output(item: dict, budget: dict) -> dict | None:
    kind = item.get("output_type")
    if kind == "stream":
        name = (
            item.get("name")
            if item.get("name") in ("stdout", "stderr")
            else "stdout"
        )
        return {
            "output_type": kind,
            "name": name,
            "text": _text(item.get("text"), budget),
        }
    if kind == "error":
        lines = (
            item.get("traceback")
            if isinstance(item.get("traceback"), list)
            else []
        )
        return {
            "output_type": kind,
            "ename": _text(item.get("ename"), budget, 200),
            "evalue": _text(item.get("evalue"), budget, 2000),
            "traceback": [_text(line, budget) for line in lines[:200]],
        }
    if kind in ("display_data", "execute_result"):
        data = item.get("data") if isinstance(item.get("data"), dict) else {}
        kept = {"text/plain": _text(data.get("text/plain", ""), budget)}
        image = (
            _image(data.get("image/png"), budget)
            if "image/png" in data
            else None
        )
        if image is not None:
            kept["image/png"] = image
        elif "image/png" in data:
            kept["text/plain"] += _text(
                "\n[an image left out by the grader: over its size limit]",
                budget,
            )
        output = {"output_type": kind, "data": kept, "metadata": {}}
        return (
            {**output, "execution_count": None}
            if kind == "execute_result"
            else output
        )
    return None


def outputs_message(cells: list[dict]) -> dict:
    """The :data:`OUTPUTS` array of a report: ``cells`` as JSON bytes."""
    return (
        {OUTPUTS: np.frombuffer(json.dumps(cells).encode(), dtype=np.uint8)}
        if cells
        else {}
    )


def outputs_of(
    arrays: dict, room: int = MAX_OUTPUT_CHARS
) -> dict[str, list[dict]]:
    """``{cell key: its cleaned outputs}`` of a report's :data:`OUTPUTS` array
    (nothing when it is missing, malformed or over twice
    :data:`MAX_OUTPUT_CHARS` bytes), at most ``room`` characters in all."""
    raw = arrays.get(OUTPUTS)
    if (
        raw is None
        or raw.dtype != np.uint8
        or raw.ndim != 1
        or raw.size > 2 * MAX_OUTPUT_CHARS
    ):
        return {}
    try:
        cells = json.loads(raw.tobytes().decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}
    found: dict[str, list[dict]] = {}
    for cell in cells if isinstance(cells, list) else []:
        key = cell.get("key") if isinstance(cell, dict) else None
        if (
            isinstance(key, str)
            and key.isdigit()
            and key not in found
            and room > 0
        ):
            found[key] = clean_outputs(cell.get("outputs"), room)
            room -= output_chars(found[key])
    return found


def output_chars(outputs: list[dict]) -> int:
    """The characters an output list holds (its texts and images), as
    :func:`clean_outputs` counts them."""
    return len(json.dumps(outputs))
