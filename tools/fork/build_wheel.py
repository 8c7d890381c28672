# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build the fork wheel: the pinned upstream vLLM wheel, edited in place.

    python3 tools/fork/build_wheel.py [--out dist] [--base 0.33.0]

Upstream entries the edits leave alone are copied as stored (the compiled
parts included); the edited files, the new modules and the fork's own
packages are added, the dist-info renamed to the local version, RECORD
rewritten. No GPU, no compiler.
"""

import argparse
import base64
import csv
import hashlib
import io
import os
import struct
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork.common import (  # noqa: E402
    FORK_PACKAGES,
    REPO,
    add_base_argument,
    load_pin,
    log,
    select_base,
    upstream_wheel,
)
from tools.fork.fork_tree import fork_files  # noqa: E402

# Zip records (APPNOTE.TXT 4.3.7, 4.3.12, 4.3.16): zipfile has no public way
# to write stored bytes unchanged, and re-deflating ~770 MB of compiled parts
# costs a minute, so the wheel is written record by record.
_LOCAL = struct.Struct("<4s5H3L2H")
_CENTRAL = struct.Struct("<4s6H3L5H2L")
_END = struct.Struct("<4s4H2LH")
_DATA_DESCRIPTOR_FLAG = 0x08
_UTF8_FLAG = 0x800
# A fixed timestamp for the fork's own entries keeps the wheel reproducible.
_FIXED_TIME = (2026, 1, 1, 0, 0, 0)


def fork_version() -> str:
    pin = load_pin()
    return f"{pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}"


def fork_wheel_name(arch: str | None = None) -> str:
    pin = load_pin()
    upstream_name, _ = pin.WHEELS[arch or pin.DEFAULT_ARCH]
    return upstream_name.replace(pin.VLLM_VERSION, fork_version(), 1)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "sha256=" + digest.rstrip(b"=").decode()


def stored_entries(path: Path) -> Iterator[tuple[zipfile.ZipInfo, bytes]]:
    """Each entry of the zip ``path`` with its bytes as stored (compressed)."""
    with zipfile.ZipFile(path) as zf, path.open("rb") as f:
        for info in zf.infolist():
            f.seek(info.header_offset)
            fields = _LOCAL.unpack(f.read(_LOCAL.size))
            f.seek(fields[-2] + fields[-1], io.SEEK_CUR)  # name, extra field
            yield info, f.read(info.compress_size)


def _copied(info: zipfile.ZipInfo, stored: bytes) -> tuple:
    # Sizes go in the header, so no data descriptor follows the bytes.
    flags = info.flag_bits & ~_DATA_DESCRIPTOR_FLAG
    return (info.filename, stored, info.CRC, info.file_size, info.compress_type,
            flags, info.date_time, info.external_attr)  # fmt: skip


def _deflated(name: str, data: bytes) -> tuple:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    stored = deflate.compress(data) + deflate.flush()
    return (name, stored, zlib.crc32(data), len(data), zipfile.ZIP_DEFLATED, 0,
            _FIXED_TIME, 0o644 << 16)  # fmt: skip


def write_zip(f: BinaryIO, entries: Iterable[tuple]) -> None:
    """A zip of ``entries`` (``_copied`` or ``_deflated``), without ZIP64: a
    wheel that would need it is refused."""
    central = []
    for name, stored, crc, size, method, flags, when, attr in entries:
        offset, encoded = f.tell(), name.encode()
        if max(offset, size, len(stored)) >= 0xFFFFFFFF or len(central) >= 0xFFFF:
            raise SystemExit(f"{name}: the wheel would need ZIP64")
        flags |= 0 if name.isascii() else _UTF8_FLAG
        y, mo, d, h, mi, sec = when
        dos = (h << 11 | mi << 5 | sec // 2, (y - 1980) << 9 | mo << 5 | d)
        common = (20, flags, method, *dos, crc, len(stored), size, len(encoded))
        f.write(_LOCAL.pack(b"PK\x03\x04", *common, 0) + encoded + stored)
        # Made by Unix (3), so that the file modes in ``attr`` apply.
        fields = (3 << 8 | 20, *common, 0, 0, 0, 0, attr, offset)
        central.append(_CENTRAL.pack(b"PK\x01\x02", *fields) + encoded)
    start, directory, n = f.tell(), b"".join(central), len(central)
    f.write(directory + _END.pack(b"PK\x05\x06", 0, 0, n, n, len(directory), start, 0))


def build(out_dir: Path, arch: str | None = None) -> Path:
    """Write the fork wheel for ``arch`` into ``out_dir``; return its path.

    Written under a temporary name and renamed when complete: concurrent
    builds cannot collide and a failed one (a full disk) leaves nothing.
    """
    pin = load_pin()
    source = upstream_wheel(arch)
    target = out_dir / fork_wheel_name(arch)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(
            dir=out_dir, prefix=f".{target.name}.", suffix=".partial"
        )
    except OSError as e:
        raise SystemExit(
            f"cannot write the fork wheel to {out_dir}: {e.strerror or e}. "
            "Choose a writable folder with --out."
        ) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _write(source, tmp, pin)
        tmp.chmod(0o644)  # mkstemp's file is private; a wheel is not
        tmp.replace(target)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SystemExit(
                f"writing {target} failed: {e.strerror or e} (the partial "
                "wheel was removed)"
            ) from None
        raise
    return target


def _write(source: Path, tmp: Path, pin) -> None:
    """The fork wheel's entries, from the upstream wheel ``source``."""
    old_info = f"vllm-{pin.VLLM_VERSION}.dist-info/"
    new_info = f"vllm-{fork_version()}.dist-info/"
    edited, new = fork_files(source)
    files = {**edited, **new}
    with zipfile.ZipFile(source) as src:
        shadowing = sorted(set(new) & set(src.namelist()))
        if shadowing:
            raise SystemExit(
                f"new modules would replace upstream files: {shadowing}; change "
                "upstream files through tools/fork/edits.py"
            )
        record = {
            row[0]: row[1:]
            for row in csv.reader(io.StringIO(src.read(old_info + "RECORD").decode()))
        }
        info_files = {
            new_info + name[len(old_info) :]: src.read(name)
            for name in src.namelist()
            if name.startswith(old_info) and not name.endswith("/RECORD")
        }
    rows: list[tuple[str, ...]] = []

    def entries() -> Iterator[tuple]:
        for info, stored in stored_entries(source):
            if not info.filename.startswith(old_info) and info.filename not in files:
                rows.append((info.filename, *record[info.filename]))
                yield _copied(info, stored)
        for name, data in [*sorted(files.items()), *info_files.items()]:
            if name.endswith("/METADATA"):
                data = _with_version(data.decode(), fork_version()).encode()
            if name.endswith("/top_level.txt"):
                data = _with_top_level(data.decode()).encode()
            rows.append((name, _record_hash(data), str(len(data))))
            yield _deflated(name, data)
        buf = io.StringIO()
        rows.append((new_info + "RECORD", "", ""))
        csv.writer(buf, lineterminator="\n").writerows(rows)
        yield _deflated(new_info + "RECORD", buf.getvalue().encode())

    with tmp.open("wb") as f:
        write_zip(f, entries())


def _with_version(metadata: str, version: str) -> str:
    lines = metadata.split("\n")
    idx = next(i for i, line in enumerate(lines) if line.startswith("Version: "))
    lines[idx] = f"Version: {version}"
    return "\n".join(lines)


def _with_top_level(top_level: str) -> str:
    """Upstream's top-level names and the fork's own packages."""
    names = top_level.split()
    names += [p.name for p in FORK_PACKAGES if p.name not in names]
    return "".join(f"{n}\n" for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    add_base_argument(parser)
    parser.add_argument(
        "--arch", default=None, help="x86_64 or aarch64 (default: the pin's)"
    )
    args = parser.parse_args()
    select_base(args.base)
    wheel = build(args.out, args.arch)
    log(f"built {wheel} ({wheel.stat().st_size / 1e6:.0f} MB)")
    print(wheel)


if __name__ == "__main__":
    main()
