# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build the fork wheel: the pinned upstream vLLM wheel, edited in place.

    python3 tools/fork/build_wheel.py [--out dist] [--base 0.34.0]

Upstream entries the edits leave alone, compiled parts included, are copied as
stored; the edited files, new modules and the fork's own packages are added,
the dist-info renamed to the local version, RECORD rewritten. No GPU, no compiler.
"""

import argparse
import csv
import functools
import io
import os
import re
import struct
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fork import common, name_check  # noqa: E402
from tools.fork.common import REPO, load_pin, log  # noqa: E402
from tools.fork.edit_engine import apply_edits  # noqa: E402
from tools.fork.edits import EDITS  # noqa: E402

# Zip records (APPNOTE.TXT 4.3.7, 4.3.12, 4.3.16): zipfile has no public way
# to write stored bytes unchanged, and re-deflating ~770 MB of compiled parts
# costs a minute, so the wheel is written record by record.
_LOCAL = struct.Struct("<4s5H3L2H")
_CENTRAL = struct.Struct("<4s6H3L5H2L")
_END = struct.Struct("<4s4H2LH")
# A fixed timestamp for the fork's own entries keeps the wheel reproducible.
_FIXED_TIME = (2026, 1, 1, 0, 0, 0)


def fork_version() -> str:
    pin = load_pin()
    return f"{pin.VLLM_VERSION}+{pin.LOCAL_VERSION_TAG}"


def fork_wheel_name(arch: str | None = None) -> str:
    pin = load_pin()
    upstream_name, _ = pin.WHEELS[arch or pin.DEFAULT_ARCH]
    return upstream_name.replace(pin.VLLM_VERSION, fork_version(), 1)


def edited_upstream_files(wheel: Path) -> dict[str, bytes]:
    """Edited upstream files of ``wheel``: the wheel's and the dev venv's alike."""
    with zipfile.ZipFile(wheel) as src:
        names = set(src.namelist())

        def read(path: str) -> str:
            if path not in names:
                raise SystemExit(f"{path}: not in {wheel.name}; the edit list names it")
            return src.read(path).decode()

        base = load_pin().VLLM_VERSION
        edited = apply_edits(read, EDITS, base)
        new = {
            str(p): (REPO / p).read_text()
            for p in [*common.new_module_files(), *common.fork_package_files()]
            if p.suffix == ".py"
        }

        @functools.cache
        def module_text(module: str) -> str | None:
            """The module's source; ``pkg.__init__`` only for a package."""
            stem = module.replace(".", "/")
            paths = [f"{stem}.py"]
            if not stem.endswith("/__init__"):
                paths.append(f"{stem}/__init__.py")
            for path in paths:
                for files in (edited, new):
                    if path in files:
                        return files[path]
                if path in names:
                    return src.read(path).decode()
            return None

        name_check.check(edited, read, new, module_text, base)
    return {path: text.encode() for path, text in edited.items()}


def fork_files(wheel: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    edited = edited_upstream_files(wheel)
    log(f"in-place edits: {len(EDITS)} edits in {len(edited)} upstream files")
    for path in sorted(edited):
        log(f"  edited {path}")
    paths = [*common.new_module_files(), *common.fork_package_files()]
    return edited, {str(p): (REPO / p).read_bytes() for p in paths}


def stored_entries(path: Path) -> Iterator[tuple[zipfile.ZipInfo, bytes]]:
    """Each entry of the zip ``path`` with its bytes as stored (compressed)."""
    with zipfile.ZipFile(path) as zf, path.open("rb") as f:
        for info in zf.infolist():
            f.seek(info.header_offset)
            fields = _LOCAL.unpack(f.read(_LOCAL.size))
            f.seek(fields[-2] + fields[-1], io.SEEK_CUR)  # name, extra field
            yield info, f.read(info.compress_size)


def _copied(info: zipfile.ZipInfo, stored: bytes) -> tuple:
    flags = info.flag_bits & ~0x08  # sizes go in the header: no data descriptor
    return (info.filename, stored, info.CRC, info.file_size, info.compress_type,
            flags, info.date_time, info.external_attr)  # fmt: skip


def _deflated(name: str, data: bytes) -> tuple:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    stored = deflate.compress(data) + deflate.flush()
    return (name, stored, zlib.crc32(data), len(data), zipfile.ZIP_DEFLATED, 0,
            _FIXED_TIME, 0o644 << 16)  # fmt: skip


def write_zip(f: BinaryIO, entries: Iterable[tuple]) -> None:
    """A zip of ``entries`` (``_copied`` or ``_deflated``); refuses ZIP64."""
    central = []
    for name, stored, crc, size, method, flags, when, attr in entries:
        offset, encoded = f.tell(), name.encode()
        if max(offset, size, len(stored)) >= 0xFFFFFFFF or len(central) >= 0xFFFF:
            raise SystemExit(f"{name}: the wheel would need ZIP64")
        flags |= 0 if name.isascii() else 0x800  # the name is UTF-8
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
    """Write the fork wheel for ``arch`` into ``out_dir``; return its path. It
    is written under a temporary name and renamed when complete: concurrent
    builds cannot collide and a failed one (a full disk) leaves nothing."""
    source, target = common.upstream_wheel(arch), out_dir / fork_wheel_name(arch)
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
        _write(source, tmp)
        tmp.chmod(0o644)  # mkstemp's file is private; a wheel is not
        tmp.replace(target)
    except OSError as e:
        raise SystemExit(
            f"writing {target} failed: {e.strerror or e} (the partial "
            "wheel was removed)"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)  # nothing left once renamed
    return target


def _write(source: Path, tmp: Path) -> None:
    version = fork_version()
    old_info = f"vllm-{load_pin().VLLM_VERSION}.dist-info/"
    new_info = f"vllm-{version}.dist-info/"
    edited, new = fork_files(source)
    files = {**edited, **new}
    with zipfile.ZipFile(source) as src:
        if shadowing := sorted(set(new) & set(src.namelist())):
            raise SystemExit(
                f"new modules would replace upstream files: {shadowing}; change "
                "upstream files through tools/fork/edits.py"
            )
        upstream_record = io.StringIO(src.read(old_info + "RECORD").decode())
        record = {row[0]: row[1:] for row in csv.reader(upstream_record)}
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
                line = b"Version: " + version.encode()
                data = re.sub(rb"(?m)^Version: .*$", line, data, count=1)
                data = common.fork_metadata(data.decode()).encode()
            if name.endswith("/top_level.txt"):  # upstream's and the fork's own
                top = data.decode().split()
                top += [p.name for p in common.FORK_PACKAGES if p.name not in top]
                data = "".join(f"{n}\n" for n in top).encode()
            rows.append(common.record_row(name, data))
            yield _deflated(name, data)
        buf = io.StringIO()
        rows.append((new_info + "RECORD", "", ""))
        csv.writer(buf, lineterminator="\n").writerows(rows)
        yield _deflated(new_info + "RECORD", buf.getvalue().encode())

    with tmp.open("wb") as f:
        write_zip(f, entries())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    common.add_base_argument(parser)
    parser.add_argument("--arch", help="x86_64 or aarch64 (default: the pin's)")
    args = parser.parse_args()
    common.select_base(args.base)
    wheel = build(args.out, args.arch)
    log(f"built {wheel} ({wheel.stat().st_size / 1e6:.0f} MB)")
    print(wheel)


if __name__ == "__main__":
    main()
