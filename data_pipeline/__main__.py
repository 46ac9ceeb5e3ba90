"""``python -m data_pipeline {prepare,train-tokenizer,verify}``.

Errors in the input or the flags end the run with one ``error:`` line on stderr and a non-zero
exit code (2 for flags, 1 for data), never a traceback.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from data_pipeline.executors import TaskFailed
from data_pipeline.executors.local import LocalExecutor
from data_pipeline.executors.slurm import SlurmExecutor, SlurmOptions
from data_pipeline.ingest import IngestConfig, ingest
from data_pipeline.manifest import MANIFEST, DatasetError, file_sha256, load_manifest
from data_pipeline.minhash import HASHES, VERIFY_MODES, MinHashConfig
from data_pipeline.normalize import UNICODE_FORMS, WHITESPACE_MODES, FilterConfig, NormalizeConfig
from data_pipeline.prepare import OUTPUT_FORMATS, PrepareConfig, prepare
from data_pipeline.shingle_text import ShingleNormalization
from data_pipeline.sources import DomainSource, InputError
from data_pipeline.stats import DomainCounts, RejectLog, summary_table
from data_pipeline.tokenizer import train_bpe_tokenizer


def _add_input_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input")
    g.add_argument("--domain", action="append", required=True, metavar="NAME=PATH",
                   help="a domain and a directory or glob of .jsonl/.json/.parquet/.txt/.tar "
                        "files; repeat for more domains or more sources of one domain")
    g.add_argument("--text-field", default="text", help="record field holding the text")
    g.add_argument("--strict", action="store_true",
                   help="stop at the first input error (bad UTF-8, broken JSON, truncated "
                        "tar, ...), naming its file and line; by default they are counted")
    g.add_argument("--unicode-form", default="NFC", choices=[*UNICODE_FORMS, "none"])
    g.add_argument("--whitespace", default="tidy", choices=WHITESPACE_MODES,
                   help="tidy: line endings, trailing spaces, blank-line runs; collapse: every "
                        "whitespace run to one space")
    g.add_argument("--min-chars", type=int, default=FilterConfig.min_chars)
    g.add_argument("--max-bytes", type=int, default=FilterConfig.max_bytes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m data_pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    prep = sub.add_parser("prepare", help="sources -> deduplicated, tokenized WebDataset shards")
    _add_input_flags(prep)
    prep.add_argument("--output", required=True, type=Path, help="new dataset directory")
    tok = prep.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", type=Path, help="a local tokenizer.json")
    tok.add_argument("--vocab-size", type=int, help="train a byte-level BPE on the kept text")
    prep.add_argument("--vocab-sample-bytes", type=int,
                      default=PrepareConfig.vocab_sample_bytes,
                      help="with --vocab-size: train on about this many bytes of text, the same "
                           "share of every partition, duplicates left out (0: all kept text)")
    d = prep.add_argument_group("deduplication")
    defaults = MinHashConfig()
    d.add_argument("--no-near-dedup", action="store_true", help="exact deduplication only")
    d.add_argument("--ngram", type=int, default=defaults.ngram, help="words per shingle")
    d.add_argument("--num-perm", type=int, default=defaults.num_perm)
    d.add_argument("--bands", type=int, default=defaults.bands)
    d.add_argument("--rows", type=int, default=defaults.rows)
    d.add_argument("--threshold", type=float, default=defaults.threshold,
                   help="Jaccard a candidate pair needs to be merged")
    d.add_argument("--verify", default=defaults.verify, choices=VERIFY_MODES,
                   help="confirm LSH candidates by exact shingle-set Jaccard or by the "
                        "MinHash estimate")
    d.add_argument("--minhash-seed", type=int, default=defaults.seed)
    d.add_argument("--minhash-hash", default=defaults.hash, choices=HASHES,
                   help="fast: vectorized word hash; sha1: datasketch's default shingle hash")
    view = ShingleNormalization()
    for name, what in (("lowercase", "lowercase before shingling"),
                       ("punctuation", "remove Unicode punctuation before shingling"),
                       ("digits", "fold every digit run to 0 before shingling"),
                       ("unicode", "NFKD and drop combining marks (accents) before shingling")):
        d.add_argument(f"--shingle-{name}", action=argparse.BooleanOptionalAction,
                       default=getattr(view, name), help=f"{what} (dedup only; the text "
                                                         f"trained on is unchanged)")
    o = prep.add_argument_group("output")
    o.add_argument("--shard-max-docs", type=int, default=PrepareConfig.shard_max_docs)
    o.add_argument("--shard-max-bytes", type=int, default=PrepareConfig.shard_max_bytes)
    o.add_argument("--reject-samples", type=int, default=PrepareConfig.reject_samples,
                   help="rejected documents per reason written to rejects.jsonl")
    o.add_argument("--output-format", default="webdataset", choices=OUTPUT_FORMATS,
                   help="megatron: also OUTPUT/megatron/DOMAIN.bin/.idx (megatron-core's "
                        "IndexedDatasetBuilder, one document per entry)")
    x = prep.add_argument_group("execution")
    x.add_argument("--executor", default="local", choices=["local", "slurm"],
                   help="local: a process pool here; slurm: one job array per stage, chained "
                        "with --dependency=afterok")
    x.add_argument("--workers", type=int, default=1, help="local executor's processes")
    x.add_argument("--partition-bytes", type=int, default=PrepareConfig.partition_bytes,
                   help="input bytes per read task (whole files, one domain); fixes the "
                        "output, unlike --workers")
    x.add_argument("--slurm-partition", help="sbatch --partition")
    x.add_argument("--slurm-cpus-per-task", type=int, default=1)
    x.add_argument("--slurm-mem", help="sbatch --mem per task, e.g. 8G")
    x.add_argument("--slurm-time", help="sbatch --time per task, e.g. 01:00:00")
    x.add_argument("--slurm-log-dir", help="per-task logs (default: the work directory)")
    x.add_argument("--slurm-extra", action="append", default=[], metavar="FLAG",
                   help="another sbatch flag, e.g. --slurm-extra=--account=abc; repeatable")

    train = sub.add_parser("train-tokenizer", help="train a byte-level BPE on the sources")
    _add_input_flags(train)
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--output", required=True, type=Path, help="tokenizer.json to write")

    check = sub.add_parser("verify", help="re-hash every shard (and Megatron-format file) of "
                                          "prepared datasets against their manifest")
    check.add_argument("datasets", nargs="+", type=Path, metavar="DIR",
                       help="`prepare` output directories")
    return parser


def _verify(args: argparse.Namespace) -> None:
    """The trainer checks each shard's size, index and offsets when it opens a dataset; bytes
    changed in place (a bad copy, a failing disk) only a hash finds, so this reads every file
    the manifest hashed once, after a copy, and names each that differs."""
    bad = []
    for root in args.datasets:
        manifest = load_manifest(root)
        shards = manifest["shards"]
        files = {s["tar"]: s["sha256"] for s in shards}
        # --output-format megatron: each domain's .bin and .idx, hashed when written.
        files |= {f["file"]: f["sha256"] for d in manifest.get("megatron", {}).values()
                  for f in d.values()}
        differ = [name for name, digest in files.items()
                  if not (root / name).is_file() or file_sha256(root / name) != digest]
        bad += [f"{root / name}" for name in differ]
        tokens = sum(s["tokens"] for s in shards)
        print(f"{root}: {len(files)} files ({len(shards)} shards), {tokens} tokens, "
              + (f"{len(differ)} differ from {MANIFEST}" if differ else "every sha256 matches"))
    if bad:
        raise DatasetError(f"sha256 differs from {MANIFEST} for {len(bad)} file(s): "
                           + ", ".join(bad))


def _ingest_config(args: argparse.Namespace) -> IngestConfig:
    return IngestConfig(
        NormalizeConfig(None if args.unicode_form == "none" else args.unicode_form,
                        args.whitespace),
        FilterConfig(args.min_chars, args.max_bytes), args.text_field, args.strict)


def _executor(args: argparse.Namespace) -> LocalExecutor | SlurmExecutor:
    if args.executor == "local":
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        return LocalExecutor(args.workers)
    if not shutil.which("sbatch"):
        raise ValueError("--executor slurm needs sbatch on PATH")
    return SlurmExecutor(SlurmOptions(args.slurm_partition, args.slurm_cpus_per_task,
                                      args.slurm_mem, args.slurm_time, args.slurm_log_dir,
                                      tuple(args.slurm_extra)))


def _prepare(args: argparse.Namespace) -> None:
    executor = _executor(args)
    cfg = PrepareConfig(
        sources=tuple(DomainSource.parse(spec) for spec in args.domain),
        output=args.output, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
        vocab_sample_bytes=args.vocab_sample_bytes,
        ingest=_ingest_config(args),
        minhash=MinHashConfig(args.ngram, args.num_perm, args.minhash_seed, args.bands,
                              args.rows, args.threshold, args.minhash_hash, args.verify,
                              ShingleNormalization(args.shingle_lowercase,
                                                   args.shingle_punctuation, args.shingle_digits,
                                                   args.shingle_unicode)),
        near_dedup=not args.no_near_dedup, shard_max_docs=args.shard_max_docs,
        shard_max_bytes=args.shard_max_bytes, reject_samples=args.reject_samples,
        partition_bytes=args.partition_bytes, output_format=args.output_format)
    result = prepare(cfg, executor)
    print(result.summary())
    print(f"wrote {len(result.manifest['shards'])} shards to {result.output} "
          f"(fingerprint {result.manifest['fingerprint'][:16]})")


def _train_tokenizer(args: argparse.Namespace) -> None:
    if args.output.exists():
        raise InputError(f"--output {args.output} already exists")
    try:  # before the training: a file that cannot be written there fails now, in one line
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.touch(exist_ok=False)
        args.output.unlink()
    except OSError as exc:
        raise InputError(f"--output {args.output}: cannot write there ({exc.strerror})") from None
    counts: dict[str, DomainCounts] = {}
    records = ingest([DomainSource.parse(spec) for spec in args.domain], _ingest_config(args),
                     counts, RejectLog(0))
    tokenizer = train_bpe_tokenizer((text for _, text in records), args.vocab_size)
    tokenizer.save(str(args.output))
    for c in counts.values():
        c.kept = c.records_in - c.rejected_total
    print(summary_table(counts))
    print(f"wrote {args.output} ({tokenizer.get_vocab_size()} tokens)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            _prepare(args)
        elif args.command == "verify":
            _verify(args)
        else:
            _train_tokenizer(args)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    except (InputError, DatasetError, TaskFailed) as exc:
        parser.exit(1, f"error: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
