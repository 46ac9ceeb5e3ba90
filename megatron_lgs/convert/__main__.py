"""python -m megatron_lgs.convert to-hf CHECKPOINT OUT | from-hf HF_DIR CHECKPOINT

Bad input (not our checkpoint, an architecture or option with no faithful mapping, an unreadable
weights file, a target that exists) is one line on stderr and exit code 2, with nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys

# Nothing is ever downloaded: transformers reads only the directories it is given.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import megatron_lgs  # noqa: E402,F401  (prepares megatron-core before it is imported)
from megatron_lgs.convert.errors import ConvertError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megatron_lgs.convert",
                                     description="Hugging Face export and import.")
    sub = parser.add_subparsers(dest="command", required=True)
    to_hf = sub.add_parser("to-hf", help="checkpoint (any layout) -> transformers directory")
    to_hf.add_argument("checkpoint", help="a --save directory or one of its iter_N directories")
    to_hf.add_argument("out")
    from_hf = sub.add_parser("from-hf", help="transformers directory -> weights-only checkpoint")
    from_hf.add_argument("hf_dir")
    from_hf.add_argument("checkpoint")
    args = parser.parse_args(argv)
    from megatron_lgs.convert import export, import_hf
    try:
        if args.command == "to-hf":
            out = export.to_hf(args.checkpoint, args.out)
            print(f"wrote {out}")
        else:
            out = import_hf.from_hf(args.hf_dir, args.checkpoint)
            record = megatron_lgs.model_record.read(out / "iter_0000000")
            print(f"wrote {out}; train from it with: --load {out} --finetune "
                  + " ".join(import_hf.model_flags(record.model)))
    except ConvertError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
