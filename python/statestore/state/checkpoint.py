"""Kafka Streams' ``.checkpoint`` file, read and written byte for byte as Kafka does.

Format version 0, UTF-8, ``\\n`` line ends::

    0
    <n>
    <topic> <partition> <offset>     (n lines)

The offset is that of the *last applied* changelog record; restoration resumes
at ``offset + 1``. ``OFFSET_UNKNOWN`` (-4) marks a logged store whose position
is not known. Kafka's known behaviour is kept where files must interoperate
(an empty map deletes the file; other negative offsets are skipped on read and
refused on write) and its rough edges become clear errors that name the file
and the line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

from statestore import _native
from statestore.errors import CheckpointError
from statestore.ids import OFFSET_UNKNOWN, TopicPartition

logger = logging.getLogger(__name__)

#: The only checkpoint format version Kafka Streams has ever written.
VERSION = 0
#: File name of a task's checkpoint inside its task directory.
CHECKPOINT_FILE_NAME = ".checkpoint"

_INT_RE = re.compile(r"[+-]?[0-9]+")
#: Java's ``\s`` (what Kafka's reader splits entry lines on): ASCII whitespace only. Python's ``\s``
#: would also split on non-ASCII whitespace (no-break space, U+2028, ...), so a line Kafka reads as
#: three fields could read as four here.
_WS_RE = re.compile(r"[ \t\n\x0b\f\r]+")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
#: Digits of the largest value any field may hold (2**63 - 1).
_MAX_DIGITS = 19


def _clip(text: str, limit: int = 40) -> str:
    """``text`` shortened for an error message (a damaged file may hold megabytes on one line)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _is_valid_offset(offset: int) -> bool:
    return offset >= 0 or offset == OFFSET_UNKNOWN


class OffsetCheckpoint:
    """The checkpoint file at ``path``: changelog offsets of one task's stores."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"OffsetCheckpoint({str(self.path)!r})"

    # -- writing -------------------------------------------------------------

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the file with ``offsets`` atomically (temp file, fsync, rename, fsync dir).

        An empty mapping deletes the file. Any negative offset other than
        ``OFFSET_UNKNOWN`` raises ``ValueError`` naming the partition, and
        nothing is written. The parent directory is never created: if it is
        missing, ``CheckpointError`` names the path.
        """
        if not offsets:
            self.delete()
            return
        lines = [str(VERSION), str(len(offsets))]
        for tp, offset in sorted(offsets.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            topic, partition = tp[0], tp[1]
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise ValueError(f"offset of {topic}-{partition} is not an integer: {offset!r}")
            if not _is_valid_offset(offset):
                raise ValueError(
                    f"refusing to write negative offset {offset} for {topic}-{partition} to {self.path} "
                    f"(only offsets >= 0 or OFFSET_UNKNOWN={OFFSET_UNKNOWN} are valid)"
                )
            if not topic or _WS_RE.search(topic):
                raise ValueError(f"topic name {topic!r} cannot be written to a checkpoint file")
            lines.append(f"{topic} {partition} {offset}")
        data = ("\n".join(lines) + "\n").encode("utf-8")
        try:
            _native.atomic_write(str(self.path), data)
        except FileNotFoundError as e:
            raise CheckpointError(
                f"cannot write checkpoint {self.path}: No such file or directory (parent directory is missing)",
                path=self.path,
            ) from e
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoint {self.path}: {e}", path=self.path) from e

    def delete(self) -> None:
        """Remove the file; a missing file is fine."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot delete checkpoint {self.path}: {e}", path=self.path) from e

    # -- reading -------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the file is present."""
        return self.path.is_file()

    def read(self) -> dict[TopicPartition, int]:
        """Read the offsets; a missing file reads as ``{}``.

        Offsets that are negative but not ``OFFSET_UNKNOWN`` are skipped with a
        warning and do not count towards the expected entry count (as in
        Kafka). An unknown version, a wrong count, a malformed line or a
        non-numeric field raise ``CheckpointError`` naming the file and line.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {e}", path=self.path) from e
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(
                f"{self.path}: not UTF-8 text at byte {e.start}; delete the file to restore from the changelog",
                path=self.path,
            ) from e
        return self._parse(text)

    def _fail(self, lineno: int, what: str) -> CheckpointError:
        return CheckpointError(
            f"{self.path}:{lineno}: {what}; the file is damaged -- delete it to restore the task from its changelog",
            path=self.path,
        )

    def _int(self, lineno: int, field: str, text: str, bounds: tuple[int, int]) -> int:
        if not _INT_RE.fullmatch(text):
            raise self._fail(lineno, f"{field} is not a number: {text!r}")
        # Leading zeros are fine (as for Java's parseLong); more significant
        # digits than a long holds are out of range -- and int() would refuse
        # a digit string beyond sys.get_int_max_str_digits() with ValueError.
        digits = text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > _MAX_DIGITS:
            raise self._fail(lineno, f"{field} is out of range: {_clip(text)!r}")
        value = -int(digits) if text.startswith("-") else int(digits)
        if not bounds[0] <= value <= bounds[1]:
            raise self._fail(lineno, f"{field} is out of range: {text!r}")
        return value

    def _parse(self, text: str) -> dict[TopicPartition, int]:
        # Lines as Java's BufferedReader.readLine sees them: "\n", "\r\n" or
        # "\r" end a line, and a final line end does not start another line.
        lines = re.split(r"\r\n|\n|\r", text)
        if lines and lines[-1] == "":
            lines.pop()
        if not lines:
            raise self._fail(1, "file ended prematurely (no version line)")
        version = self._int(1, "version", lines[0], _INT32)
        if version != VERSION:
            raise self._fail(
                1, f"unknown offset checkpoint version {version} (only version {VERSION} is known)"
            )
        if len(lines) < 2:
            raise self._fail(2, "file ended prematurely (no entry count)")
        expected = self._int(2, "entry count", lines[1], _INT32)
        if expected < 0:
            raise self._fail(2, f"negative entry count {expected}")
        offsets: dict[TopicPartition, int] = {}
        for lineno, line in enumerate(lines[2:], start=3):
            parts = _WS_RE.split(line)
            while parts and parts[-1] == "":  # Java's split drops trailing empty strings
                parts.pop()
            if len(parts) != 3:
                raise self._fail(lineno, f"malformed line {line!r} (expected '<topic> <partition> <offset>')")
            topic = parts[0]
            partition = self._int(lineno, "partition", parts[1], _INT32)
            offset = self._int(lineno, "offset", parts[2], _INT64)
            if not topic:
                raise self._fail(lineno, f"malformed line {line!r} (empty topic)")
            if _is_valid_offset(offset):
                offsets[TopicPartition(topic, partition)] = offset
            else:
                logger.warning(
                    "%s:%d: skipping invalid offset %d for %s-%d", self.path, lineno, offset, topic, partition
                )
                expected -= 1
        if len(offsets) != expected:
            raise self._fail(
                len(lines),
                f"expected {expected} entries but found {len(offsets)} (wrong count or duplicate entry)",
            )
        return offsets


__all__ = ["CHECKPOINT_FILE_NAME", "VERSION", "OffsetCheckpoint"]
