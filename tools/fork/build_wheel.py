# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build the fork wheel: the pinned upstream vLLM wheel, edited in place.

    python3 tools/fork/build_wheel.py [--out dist] [--base 0.33.0]

Every upstream entry the edits do not touch is copied with its compressed
bytes untouched (the compiled extensions included); the edited upstream files
and the fork's new modules are written in, with the fork's own packages
beside ``vllm`` (``FORK_PACKAGES``); the dist-info is renamed to the local
version and RECORD is rewritten. No GPU and no compiler are needed.
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
from pathlib import Path

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

# Local file header: signature, version, flags, method, time, date, crc32,
# compressed size, size, name length, extra length (APPNOTE 4.3.7).
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_DATA_DESCRIPTOR_FLAG = 0x08


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


def _copy_compressed(
    src: zipfile.ZipFile, info: zipfile.ZipInfo, dst: zipfile.ZipFile
) -> None:
    """Append ``info``'s compressed bytes to ``dst`` without inflating them.

    zipfile has no public raw copy, and re-deflating the ~770 MB of shared
    objects would cost a minute and change nothing.
    """
    assert src.fp is not None and dst.fp is not None
    src.fp.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(src.fp.read(_LOCAL_HEADER.size))
    src.fp.seek(fields[-2] + fields[-1], io.SEEK_CUR)  # name, extra
    raw = src.fp.read(info.compress_size)

    out = zipfile.ZipInfo(info.filename, info.date_time)
    out.compress_type = info.compress_type
    out.external_attr = info.external_attr
    out.create_system = info.create_system
    # Sizes go into the header we write, so no trailing data descriptor.
    out.flag_bits = info.flag_bits & ~_DATA_DESCRIPTOR_FLAG
    out.CRC, out.compress_size, out.file_size = (
        info.CRC,
        info.compress_size,
        info.file_size,
    )
    out.header_offset = dst.fp.tell()
    dst.fp.write(out.FileHeader())
    dst.fp.write(raw)
    dst.filelist.append(out)
    dst.NameToInfo[out.filename] = out
    # Where zipfile writes its next entry and, at close, the central directory.
    dst.start_dir = dst.fp.tell()


def build(out_dir: Path, arch: str | None = None) -> Path:
    """Write the fork wheel for ``arch`` into ``out_dir``; return its path.

    The wheel is written under a temporary name in ``out_dir`` and renamed
    when complete, so concurrent builds cannot collide, a reader never sees a
    partial wheel, and an interrupted or failed build (a full disk, say)
    leaves nothing behind.
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
        upstream_names = set(src.namelist())
        shadowing = sorted(set(files) - set(edited) & upstream_names)
        if shadowing:
            raise SystemExit(
                f"new modules would replace upstream files: {shadowing}; change "
                "upstream files through tools/fork/edits.py"
            )
        record = {
            row[0]: row[1:]
            for row in csv.reader(io.StringIO(src.read(old_info + "RECORD").decode()))
        }
        rows: list[tuple[str, str, str]] = []
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename.startswith(old_info) or info.filename in files:
                    continue
                _copy_compressed(src, info, dst)
                digest, size = record[info.filename]
                rows.append((info.filename, digest, size))

            def add(name: str, data: bytes) -> None:
                # A fixed timestamp keeps the wheel reproducible.
                zinfo = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))
                zinfo.compress_type = zipfile.ZIP_DEFLATED
                zinfo.external_attr = 0o644 << 16
                dst.writestr(zinfo, data)
                rows.append((name, _record_hash(data), str(len(data))))

            for name in sorted(files):
                add(name, files[name])
            for info in src.infolist():
                name = info.filename
                if not name.startswith(old_info) or name.endswith("/RECORD"):
                    continue
                data = src.read(info)
                if name.endswith("/METADATA"):
                    data = _with_version(data.decode(), fork_version()).encode()
                if name.endswith("/top_level.txt"):
                    data = _with_top_level(data.decode()).encode()
                add(new_info + name[len(old_info) :], data)

            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerows(rows)
            writer.writerow((new_info + "RECORD", "", ""))
            zinfo = zipfile.ZipInfo(new_info + "RECORD", (2026, 1, 1, 0, 0, 0))
            zinfo.compress_type = zipfile.ZIP_DEFLATED
            zinfo.external_attr = 0o644 << 16
            dst.writestr(zinfo, buf.getvalue())


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
