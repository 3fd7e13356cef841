"""Archives of traces (zip, tar, tar.gz: what CI jobs keep as artifacts), ingested without unpacking them by hand.

An archive is untrusted input. Every member is checked before anything is written: absolute paths, `..`,
links (symbolic and hard), devices and fifos refuse the whole archive, and so does a total unpacked size over
the cap (a decompression bomb). Trace members are then copied, one by one and counting bytes, into a private
scratch folder under names tracesql makes (`00003/rank-3.json.gz`: an index and the member's base name with
every character outside [A-Za-z0-9._-] replaced), so a member's name never becomes a path of its own.
"""

from __future__ import annotations

import re
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import TraceError, env_number

SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
#: Total unpacked bytes an archive may hold (TRACESQL_MAX_ARCHIVE_BYTES overrides).
DEFAULT_MAX_BYTES = 64 << 30
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_COPY_CHUNK = 1 << 20


def is_archive(path: Path) -> bool:
    return path.name.lower().endswith(SUFFIXES)


def max_bytes() -> int:
    return env_number("TRACESQL_MAX_ARCHIVE_BYTES", DEFAULT_MAX_BYTES, int, lambda cap: cap >= 1,
                      "a number of bytes (an integer above 0)")


@dataclass(frozen=True)
class Member:
    archive: Path
    name: str  # as stored in the archive (shown to users, kept as the source's path in the run)
    size: int  # unpacked bytes, as the archive declares them
    index: int  # position in the archive: the scratch file's folder name


def _check_name(archive: Path, name: str) -> None:
    pure = PurePosixPath(name.replace("\\", "/"))
    if not name or "\x00" in name:
        raise TraceError(archive, f"unsafe member {name!r}: empty name or NUL byte")
    if pure.is_absolute() or re.match(r"^[A-Za-z]:", name):
        raise TraceError(archive, f"unsafe member {name!r}: absolute path")
    if ".." in pure.parts:
        raise TraceError(archive, f"unsafe member {name!r}: '..' leads outside the archive")


def members(archive: Path, suffixes: tuple[str, ...]) -> list[Member]:
    """The trace members of `archive` (names ending in `suffixes`, not hidden), after checking every member."""
    cap = max_bytes()
    entries: list[tuple[str, int, bool]] = []  # name, size, is a regular file
    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    _check_name(archive, info.filename)
                    if info.flag_bits & 0x1:
                        raise TraceError(archive, f"member {info.filename!r} is encrypted: tracesql does not read "
                                                  "encrypted archives (unpack it with its password first)")
                    kind = stat.S_IFMT(info.external_attr >> 16)
                    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: written by a tool without Unix modes
                        what = "a symbolic link" if kind == stat.S_IFLNK else "not a regular file"
                        raise TraceError(archive, f"unsafe member {info.filename!r}: {what}")
                    entries.append((info.filename, info.file_size, not info.is_dir()))
        else:
            with tarfile.open(archive, "r:*") as t:
                for info in t:
                    _check_name(archive, info.name)
                    if info.issym() or info.islnk():
                        what = "symbolic" if info.issym() else "hard"
                        raise TraceError(archive, f"unsafe member {info.name!r}: a {what} link (to {info.linkname!r})")
                    if not (info.isfile() or info.isdir()):
                        raise TraceError(archive, f"unsafe member {info.name!r}: a device, fifo or other special file")
                    entries.append((info.name, info.size, info.isfile()))
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        raise TraceError(archive, f"damaged archive ({e})") from None
    seen: set[str] = set()
    for name, _, _ in entries:
        if name in seen:  # which of the two would be read is up to the unpacker: refuse instead
            raise TraceError(archive, f"member {name!r} appears twice")
        seen.add(name)
    total = sum(size for _, size, _ in entries)
    if total > cap:
        raise TraceError(archive, f"unpacks to {total:,} bytes, over the cap of {cap:,} "
                                  "(TRACESQL_MAX_ARCHIVE_BYTES): refused as a possible decompression bomb")
    from .readers import common  # the ratio a gzip may inflate by holds here too

    ratio_cap = max(common.INFLATE_FREE_BYTES, int(archive.stat().st_size * common.max_inflate_ratio()))
    if total > ratio_cap:
        raise TraceError(archive, f"unpacks to {total:,} bytes, {total / max(1, archive.stat().st_size):,.0f}x its "
                                  "size: refused as a possible decompression bomb (TRACESQL_MAX_GZIP_RATIO raises "
                                  "the ratio)")
    found = [Member(archive, name, size, i) for i, (name, size, regular) in enumerate(entries)
             if regular and name.endswith(suffixes) and not PurePosixPath(name).name.startswith(".")]
    if not found:
        raise TraceError(archive, f"no trace files in the archive (looked for *{', *'.join(suffixes)})")
    return found


def scratch_path(scratch: Path, member: Member) -> Path:
    """Where `member` is unpacked: a name tracesql makes, inside `scratch`."""
    base = _UNSAFE_CHARS.sub("_", PurePosixPath(member.name.replace("\\", "/")).name).lstrip(".") or "trace"
    return scratch / f"{member.index:05d}" / base


def extract(wanted: list[Member], scratch: Path) -> dict[Member, Path]:
    """Unpack `wanted` (members of one or more archives) into `scratch`; never writes anywhere else, and never
    more bytes than the members declare (a member whose data runs longer is refused)."""
    out: dict[Member, Path] = {}
    by_archive: dict[Path, list[Member]] = {}
    for m in wanted:
        by_archive.setdefault(m.archive, []).append(m)
    for archive, ms in by_archive.items():
        names = {m.name: m for m in ms}
        try:
            if archive.name.lower().endswith(".zip"):
                with zipfile.ZipFile(archive) as z:
                    for name, m in names.items():
                        with z.open(name) as src:
                            out[m] = _copy(archive, m, src, scratch)
            else:
                with tarfile.open(archive, "r:*") as t:
                    for info in t:
                        m = names.get(info.name)
                        if m is not None and info.isfile() and m not in out:
                            out[m] = _copy(archive, m, t.extractfile(info), scratch)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, RuntimeError) as e:
            raise TraceError(archive, f"damaged archive ({e})") from None
        missing = [m.name for m in ms if m not in out]
        if missing:
            raise TraceError(archive, f"member {missing[0]!r} could not be read back")
    return out


def _copy(archive: Path, member: Member, src, scratch: Path) -> Path:
    dst = scratch_path(scratch, member)
    dst.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(dst, "xb") as f:  # x: never through anything already there
        while chunk := src.read(_COPY_CHUNK):
            written += len(chunk)
            if written > member.size:
                raise TraceError(archive, f"member {member.name!r} holds more data than it declares "
                                          f"({member.size:,} bytes): refused")
            f.write(chunk)
    return dst


def remove(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)
