"""``/v1/predict`` bodies with answer options: :func:`decode_request` wraps :func:`hmt.serve.http.inputs.decode`
and adds ``multipart/form-data`` (an HTML form or ``curl -F file=@cat.jpg``), parsed with the stdlib.

The body is already bounded (read in full under the API's body limit) when it gets here; the
parser adds a bound on the number of parts. File parts (those with a ``filename``) are the
inputs, in order; plain fields are answer options (``top_k``, ``probabilities``), at most a
few bytes each.
"""

from __future__ import annotations

from email import policy
from email.message import Message
from email.parser import BytesParser
from typing import Any

import numpy as np

from hmt.serve.http.inputs import ApiError, InputSpec, decode, decode_encoded

MULTIPART_MEDIA_TYPE = "multipart/form-data"
MAX_FIELD_BYTES = 256


def parse_form(body: bytes, content_type: str, max_parts: int) -> tuple[list[bytes], dict[str, str]]:
    """(the file parts' bytes in order, the plain fields by name) of a multipart/form-data body."""
    if "boundary=" not in content_type:
        raise ApiError(400, "bad_multipart", "multipart/form-data needs a boundary parameter in Content-Type")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ApiError(400, "bad_multipart", "body is not a multipart/form-data message")
    payload = message.get_payload()
    parts = [p for p in payload if isinstance(p, Message)] if isinstance(payload, list) else []
    if message.defects or not parts:
        raise ApiError(400, "bad_multipart", "multipart body is malformed or holds no parts (check the boundary)")
    if len(parts) > max_parts:
        raise ApiError(413, "batch_too_large", f"{len(parts)} parts exceed the limit of {max_parts}")
    files: list[bytes] = []
    fields: dict[str, str] = {}
    for part in parts:
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes):
            raise ApiError(400, "bad_multipart", f"part {name!r} has no content")
        if part.get_filename() is not None:
            files.append(data)
        elif isinstance(name, str) and name:
            if len(data) > MAX_FIELD_BYTES:
                raise ApiError(400, "bad_multipart", f"form field {name[:40]!r} is longer than {MAX_FIELD_BYTES} "
                                                     "bytes; send inputs as file parts")
            fields[name] = data.decode("utf-8", "replace")
        else:
            raise ApiError(400, "bad_multipart", "a part has neither a filename nor a field name")
    if not files:
        raise ApiError(400, "bad_multipart", "multipart body holds no file part; send the image as a file "
                                             "(curl -F file=@cat.jpg)")
    return files, fields


def decode_request(body: bytes, content_type: str | None, spec: InputSpec) -> tuple[np.ndarray, dict[str, Any]]:
    """(the batch, the body's answer-option fields): JSON's ``top_k``/``probabilities`` keys, or a
    multipart form's fields; every file part of a form is one input (or a batch, for a .npy)."""
    fields: dict[str, Any] = {}
    media = (content_type or "").split(";")[0].strip().lower()
    if media != MULTIPART_MEDIA_TYPE:
        return decode(body, content_type, spec, fields), fields
    files, form = parse_form(body, content_type or "", spec.max_batch + 8)
    batches = [decode_encoded(data, spec) for data in files]
    total = sum(len(b) for b in batches)
    if total > spec.max_batch:
        raise ApiError(413, "batch_too_large", f"a batch of {total} inputs exceeds the limit of {spec.max_batch}; "
                                               "split it")
    return np.ascontiguousarray(np.concatenate(batches)), dict(form)
