"""Pure: Responses ``input_file`` parts -> the text the model reads (decision 030).

Supported: a text-like file given inline, ``file_data`` as a ``data:<type>;base64,…`` URL or
bare base64, UTF-8 once decoded. Text-like means a ``text/*`` media type, one of
``TEXT_TYPES``, or (no media type, or ``application/octet-stream``) a ``filename`` whose
extension is in ``TEXT_EXTENSIONS``. The model reads the file between two marker lines that name
it (``file_text``). Anything else is a 400 naming the part: ``file_id`` (there is no Files API
here), ``file_url``, a binary or non-UTF-8 file (a PDF included: there is no document parser),
bad base64.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import PurePosixPath

from shared.errors import InvalidRequest

TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/x-ndjson",
        "application/jsonl",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/javascript",
        "application/typescript",
        "application/x-sh",
        "application/x-python",
        "application/sql",
        "application/csv",
    }
)
TEXT_EXTENSIONS = frozenset(
    {
        ".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".jsonl", ".ndjson",
        ".xml", ".html", ".htm", ".css", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf",
        ".log", ".py", ".js", ".ts", ".tsx", ".jsx", ".java", ".c", ".h", ".cc", ".cpp",
        ".hpp", ".cs", ".go", ".rs", ".rb", ".php", ".swift", ".kt", ".scala", ".sh",
        ".bash", ".zsh", ".sql", ".r", ".lua", ".pl", ".tex", ".diff", ".patch",
    }
)  # fmt: skip
_GENERIC = frozenset({"", "application/octet-stream"})


def file_text(
    *,
    param: str,
    file_data: str | None,
    filename: str | None,
    file_id: str | None = None,
    file_url: str | None = None,
) -> str:
    """The text of one ``input_file`` part (at ``param``), framed with its name; 400 naming
    ``param`` when it is not an inline text-like file."""
    if file_id is not None:
        raise InvalidRequest(
            f"`{param}`: `file_id` is not supported (this server has no Files API); send the "
            "file inline as `file_data`.",
            param=f"{param}.file_id",
        )
    if file_url is not None:
        raise InvalidRequest(
            f"`{param}`: `file_url` is not supported; send the file inline as `file_data`.",
            param=f"{param}.file_url",
        )
    if not file_data:
        raise InvalidRequest(
            f"`{param}`: an `input_file` part needs `file_data` (base64, or a data URL).",
            param=f"{param}.file_data",
        )
    media_type, payload = _split(file_data, param)
    name = filename or "file"
    if not _is_text(media_type, filename):
        shown = media_type or "no media type"
        raise InvalidRequest(
            f"`{param}`: file `{name}` ({shown}) is not a text file; only text-like files "
            "(text/*, JSON, XML, YAML, source code…) can be read here.",
            param=param,
        )
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            f"`{param}`: `file_data` is not valid base64.", param=f"{param}.file_data"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"`{param}`: file `{name}` is not UTF-8 text.", param=f"{param}.file_data"
        ) from None
    return f"<file name={name!r}>\n{text}\n</file>"


def _split(file_data: str, param: str) -> tuple[str, str]:
    """``(media type, base64 payload)`` of a data URL, or ``("", data)`` for bare base64."""
    if not file_data.startswith("data:"):
        return "", file_data
    header, comma, payload = file_data.partition(",")
    if not comma or not header.endswith(";base64"):
        raise InvalidRequest(
            f"`{param}`: a `file_data` data URL must be `data:<media type>;base64,<data>`.",
            param=f"{param}.file_data",
        )
    media_type = header.removeprefix("data:").removesuffix(";base64").split(";")[0]
    return media_type.strip().lower(), payload


def _is_text(media_type: str, filename: str | None) -> bool:
    if media_type.startswith("text/") or media_type in TEXT_TYPES:
        return True
    if media_type not in _GENERIC:
        return False
    return filename is not None and PurePosixPath(filename).suffix.lower() in TEXT_EXTENSIONS
