"""Regenerate (``--write``) or verify (``--check``) the committed stubs of ``proto/datadist/v1``.

The stubs are committed so that installing datadist needs no protoc; this check keeps them
honest: ``make test`` fails when a ``.proto`` changed and ``make proto`` was not run.
Generated with the grpcio-tools version pinned in pyproject's test extras.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = PROTO_ROOT / "datadist" / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # test/dev dependency only

    protos = sorted(PACKAGE_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc", f"-I{PROTO_ROOT}", f"-I{include}",
        f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return [out_dir / "datadist" / "v1" / f"{p.stem}{s}" for p in protos for s in SUFFIXES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the committed stubs")
    mode.add_argument("--check", action="store_true", help="fail when the committed stubs are stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        stale = [g.name for g in generated
                 if not (PACKAGE_DIR / g.name).exists() or not filecmp.cmp(g, PACKAGE_DIR / g.name, shallow=False)]
        expected = {g.name for g in generated}
        extra = [p.name for p in PACKAGE_DIR.iterdir() if p.name.endswith(SUFFIXES) and p.name not in expected]
        if args.write:
            for g in generated:
                (PACKAGE_DIR / g.name).write_bytes(g.read_bytes())
            for name in extra:
                (PACKAGE_DIR / name).unlink()
            print(f"proto: wrote {len(generated)} files to {PACKAGE_DIR.relative_to(ROOT)}")
            return 0
        if stale or extra:
            print("proto: committed stubs are stale: " + ", ".join(stale + extra) + " -- run `make proto`",
                  file=sys.stderr)
            return 1
        print(f"proto: {len(generated)} committed stubs are up to date")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
