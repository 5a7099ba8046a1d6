#!/usr/bin/env python3
"""Writes a Megatron-LM / NeMo indexed dataset (PREFIX.bin + PREFIX.idx, the MMIDIDX format
version 1) without Megatron: numpy only, byte for byte what Megatron's IndexedDatasetBuilder
(megatron/core/datasets/indexed_dataset.py) writes for the same documents, so
`autosp train --data PREFIX` can be tried without Megatron installed.

Input:
  --jsonl FILE   one document per line, either of
                 - Megatron's JSONL, what tools/preprocess_data.py --input reads: an object
                   {"text": "..."} (the key is --json-keys, default text; its value a string,
                   or a list of strings, one sequence each), tokenized byte-level (below);
                 - token ids: a JSON list of ids (one sequence), or a list of such lists (a
                   document of several sequences, as preprocess_data.py --split-sentences
                   writes), or an object {"ids": ...} of either form.
                 One file is all text or all ids.
  --text FILE    plain text; --text-docs says where a document ends:
                   blank-line (default): at a blank line; consecutive non-blank lines (wrapped
                     prose) are one document, its line breaks kept as newline bytes;
                   lines: every non-blank line is its own document (its newline dropped).
Text is tokenized byte-level: token = a byte of its UTF-8 (0..255); --append-eod appends id
256, so the vocabulary is 257.
The dtype is Megatron's choice for the vocabulary (DType.optimal_dtype: uint16 below 65500,
else int32); --dtype overrides it (uint8 int8 int16 int32 int64 uint16).

Examples:
  python3 scripts/make_indexed_dataset.py --text notes.txt --append-eod --output-prefix data/notes
  python3 scripts/make_indexed_dataset.py --jsonl docs.jsonl --append-eod --output-prefix data/docs
  build/autosp train ... --data data/notes
"""
import argparse
import json
import struct
import sys


def import_numpy():
    """numpy, imported only to write the files, so that --help and argument errors work on
    an interpreter without it."""
    try:
        import numpy
    except ImportError:
        sys.exit(f"make_indexed_dataset.py: {sys.executable} has no numpy; install it "
                 "(Debian: apt-get install python3-numpy, then run with /usr/bin/python3)")
    return numpy

INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}
BYTE_EOD = 256


def optimal_dtype(vocab_size):
    """Megatron's DType.optimal_dtype: the dtype preprocess_data.py picks for a tokenizer."""
    return "uint16" if vocab_size is not None and vocab_size < 65500 else "int32"


def byte_tokens(text):
    return list(text.encode("utf-8"))


def read_jsonl(path, text_key):
    """Documents, each a list of sequences (lists of ints), and whether they came from text
    (tokenized byte-level) rather than token ids."""
    documents, kinds = [], set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON ({e})")
            if isinstance(value, dict) and text_key in value:
                # preprocess_data.py's Encoder: a string, or a list of strings (sentences);
                # an empty one is not a sequence.
                text = value[text_key]
                sentences = text if isinstance(text, list) else [text]
                if not all(isinstance(t, str) for t in sentences):
                    sys.exit(f"{path}:{number}: \"{text_key}\" must be a string or a list of strings")
                kinds.add("text")
                if len(kinds) > 1:
                    sys.exit(f"{path}:{number}: a text line after token id lines; a file is all text or all ids")
                documents.append([byte_tokens(t) for t in sentences if t])
                continue
            if isinstance(value, dict):
                if "ids" not in value:
                    sys.exit(f"{path}:{number}: an object without \"{text_key}\" or \"ids\" "
                             f"(keys: {', '.join(sorted(value)) or 'none'}); --json-keys names the text key")
                value = value["ids"]
            if not isinstance(value, list):
                sys.exit(f"{path}:{number}: expected a list of token ids or a list of lists")
            sequences = value if value and isinstance(value[0], list) else [value]
            for seq in sequences:
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in seq):
                    sys.exit(f"{path}:{number}: token ids must be integers")
            kinds.add("ids")
            if len(kinds) > 1:
                sys.exit(f"{path}:{number}: a token id line after text lines; a file is all text or all ids")
            # As preprocess_data.py: an empty sequence is not written; a document without any
            # stays, as a repeated document index entry.
            documents.append([seq for seq in sequences if seq])
    return documents, kinds == {"text"}


def read_text(path, text_docs):
    """Documents of one sequence each: paragraphs (text_docs "blank-line") or lines ("lines")."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    if text_docs == "lines":
        return [[byte_tokens(line)] for line in lines if line.strip()]
    documents, paragraph = [], []
    for line in lines + [""]:
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            documents.append([byte_tokens("\n".join(paragraph))])
            paragraph = []
    return documents


def write_indexed_dataset(prefix, documents, dtype):
    """As IndexedDatasetBuilder.add_document per document, then finalize(PREFIX.idx)."""
    np = import_numpy()
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
    src.add_argument("--jsonl", help="one document per line: Megatron's {\"text\": ...} (byte-level tokens "
                     "0..255), or a list of token ids, a list of lists, or {\"ids\": ...}")
    src.add_argument("--text", help="plain text, byte-level tokens 0..255; documents as --text-docs says")
    p.add_argument("--text-docs", choices=["blank-line", "lines"], default="blank-line",
                   help="--text: a document ends at a blank line (default; wrapped lines stay one "
                   "document), or every non-blank line is a document")
    p.add_argument("--json-keys", nargs="+", default=["text"], metavar="KEY",
                   help="--jsonl: the key holding a document's text, as preprocess_data.py's (default: text; one key)")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    p.add_argument("--append-eod", action="store_true",
                   help="end each non-empty document with the EOD id (--eod-id; for text 256 by default)")
    p.add_argument("--eod-id", type=int, help="the EOD token id (needed for token ids with --append-eod)")
    p.add_argument("--vocab-size", type=int,
                   help="picks the dtype as Megatron does (default: text 257, token ids max id + 1)")
    p.add_argument("--dtype", choices=sorted(DTYPE_CODES), help="the .bin dtype (default: from the vocabulary)")
    args = p.parse_args()
    if len(args.json_keys) != 1:
        # preprocess_data.py writes one dataset per key (PREFIX_KEY_document); run once per key.
        p.error(f"--json-keys takes one key here, got {len(args.json_keys)}; run once per key")

    if args.jsonl:
        documents, from_text = read_jsonl(args.jsonl, args.json_keys[0])
    else:
        documents, from_text = read_text(args.text, args.text_docs), True
    if args.append_eod:
        eod = args.eod_id if args.eod_id is not None else (BYTE_EOD if from_text else None)
        if eod is None:
            sys.exit("--jsonl of token ids with --append-eod needs --eod-id")
        for sequences in documents:
            # preprocess_data.py: the EOD joins the last sequence of a non-empty document.
            if sequences:
                sequences[-1] = sequences[-1] + [eod]
    vocab = args.vocab_size
    if vocab is None:
        ids = [t for d in documents for s in d for t in s]
        vocab = max(BYTE_EOD + 1, max(ids) + 1 if ids else 0) if from_text else (max(ids) + 1 if ids else 1)
    dtype = args.dtype or optimal_dtype(vocab)
    write_indexed_dataset(args.output_prefix, documents, dtype)
    tokens = sum(len(s) for d in documents for s in d)
    print(f"{args.output_prefix}.bin/.idx: {len(documents)} documents, {tokens} tokens, {dtype} ids")


if __name__ == "__main__":
    main()
