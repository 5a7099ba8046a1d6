#!/usr/bin/env python3
"""Writes a Megatron-LM / NeMo indexed dataset (PREFIX.bin + PREFIX.idx, the MMIDIDX format
version 1) without Megatron: numpy only, byte for byte what Megatron's IndexedDatasetBuilder
(megatron/core/datasets/indexed_dataset.py) writes for the same documents, so
`autosp train --data PREFIX` can be tried without Megatron installed.

Input, one document per line:
  --jsonl FILE   each line a JSON list of token ids (one sequence), or a list of such lists
                 (a document of several sequences, as preprocess_data.py --split-sentences
                 writes), or an object {"ids": ...} of either form.
  --text FILE    each non-empty line a document, tokenized byte-level: token = byte of its
                 UTF-8 (0..255); --append-eod appends id 256, so the vocabulary is 257.
The dtype is Megatron's choice for the vocabulary (DType.optimal_dtype: uint16 below 65500,
else int32); --dtype overrides it (uint8 int8 int16 int32 int64 uint16).

Example:
  python3 scripts/make_indexed_dataset.py --text notes.txt --append-eod --output-prefix data/notes
  build/autosp train ... --data data/notes
"""
import argparse
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit(f"make_indexed_dataset.py: {sys.executable} has no numpy; install it "
             "(Debian: apt-get install python3-numpy, then run with /usr/bin/python3)")

INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}
BYTE_EOD = 256


def optimal_dtype(vocab_size):
    """Megatron's DType.optimal_dtype: the dtype preprocess_data.py picks for a tokenizer."""
    return "uint16" if vocab_size is not None and vocab_size < 65500 else "int32"


def read_jsonl(path):
    """Documents, each a list of sequences (lists of ints)."""
    documents = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            value = json.loads(line)
            if isinstance(value, dict):
                value = value["ids"]
            if not isinstance(value, list):
                sys.exit(f"{path}:{number}: expected a list of token ids or a list of lists")
            sequences = value if value and isinstance(value[0], list) else [value]
            for seq in sequences:
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in seq):
                    sys.exit(f"{path}:{number}: token ids must be integers")
            # As preprocess_data.py: an empty sequence is not written; a document without any
            # stays, as a repeated document index entry.
            documents.append([seq for seq in sequences if seq])
    return documents


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return [[list(line.rstrip("\n").encode("utf-8"))] for line in f if line.strip()]


def write_indexed_dataset(prefix, documents, dtype):
    """As IndexedDatasetBuilder.add_document per document, then finalize(PREFIX.idx)."""
    np_dtype = np.dtype(dtype)
    info = np.iinfo(np_dtype)
    sequence_lengths, document_indices = [], [0]
    with open(prefix + ".bin", "wb") as data_file:
        for sequences in documents:
            for seq in sequences:
                if seq and (min(seq) < info.min or max(seq) > info.max):
                    sys.exit(f"a token id of {seq[:8]}... does not fit {dtype}")
                data_file.write(np.array(seq, dtype=np_dtype).tobytes(order="C"))
                sequence_lengths.append(len(seq))
            document_indices.append(len(sequence_lengths))
    # _IndexWriter._sequence_pointers: byte offsets, lengths times the item size, from 0.
    pointers, at = [], 0
    for length in sequence_lengths:
        pointers.append(at)
        at += length * np_dtype.itemsize
    with open(prefix + ".idx", "wb") as idx:
        idx.write(INDEX_HEADER)
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", DTYPE_CODES[dtype]))
        idx.write(struct.pack("<Q", len(sequence_lengths)))
        idx.write(struct.pack("<Q", len(document_indices)))
        idx.write(np.array(sequence_lengths, dtype=np.int32).tobytes(order="C"))
        idx.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        idx.write(np.array(document_indices, dtype=np.int64).tobytes(order="C"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--jsonl", help="one document per line: a list of token ids, or a list of lists")
    src.add_argument("--text", help="one document per non-empty line, byte-level tokens 0..255")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    p.add_argument("--append-eod", action="store_true",
                   help="end each non-empty document with the EOD id (--text: 256; --jsonl: --eod-id)")
    p.add_argument("--eod-id", type=int, help="the EOD token id for --jsonl --append-eod")
    p.add_argument("--vocab-size", type=int,
                   help="picks the dtype as Megatron does (default: --text 257, --jsonl max id + 1)")
    p.add_argument("--dtype", choices=sorted(DTYPE_CODES), help="the .bin dtype (default: from the vocabulary)")
    args = p.parse_args()

    documents = read_jsonl(args.jsonl) if args.jsonl else read_text(args.text)
    if args.append_eod:
        eod = BYTE_EOD if args.text else args.eod_id
        if eod is None:
            sys.exit("--jsonl --append-eod needs --eod-id")
        for sequences in documents:
            # preprocess_data.py: the EOD joins the last sequence of a non-empty document.
            if sequences:
                sequences[-1] = sequences[-1] + [eod]
    vocab = args.vocab_size
    if vocab is None:
        ids = [t for d in documents for s in d for t in s]
        vocab = BYTE_EOD + 1 if args.text else (max(ids) + 1 if ids else 1)
    dtype = args.dtype or optimal_dtype(vocab)
    write_indexed_dataset(args.output_prefix, documents, dtype)
    tokens = sum(len(s) for d in documents for s in d)
    print(f"{args.output_prefix}.bin/.idx: {len(documents)} documents, {tokens} tokens, {dtype} ids")


if __name__ == "__main__":
    main()
