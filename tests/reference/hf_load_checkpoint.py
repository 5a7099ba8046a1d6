"""Loads a model directory (an autosp checkpoint) the way a user would, with transformers'
own AutoConfig and AutoModelForCausalLM.from_pretrained, and prints one JSON line:
what loading reported (missing, unexpected and mismatched keys), the config transformers
read (dtype, rope, token ids) and the loss of the sample given (cross-entropy of tokens[1:]
given tokens[:-1]), computed in float64 on the weights as stored (bf16 widened exactly).

Run with the venv of scripts/install_hf_venv.sh:
  $VENV/bin/python hf_load_checkpoint.py DIR TOKENS   (TOKENS: comma-separated ids)
"""
import json
import sys
import warnings

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging


def main():
    path, tokens = sys.argv[1], torch.tensor([int(t) for t in sys.argv[2].split(",")])
    logging.set_verbosity_error()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = AutoConfig.from_pretrained(path)
        stored = AutoModelForCausalLM.from_pretrained(path, torch_dtype="auto")  # as stored
        model, info = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64,
                                                           output_loading_info=True)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=tokens[None, :-1]).logits[0]
    loss = F.cross_entropy(logits.to(torch.float64), tokens[1:]).item()
    weight_dtypes = sorted({str(p.dtype).replace("torch.", "") for p in stored.parameters()})
    print(json.dumps({
        "missing_keys": list(info["missing_keys"]),
        "unexpected_keys": list(info["unexpected_keys"]),
        "mismatched_keys": [list(map(str, k)) for k in info["mismatched_keys"]],
        "error_msgs": list(info["error_msgs"]),
        "torch_dtype": str(config.torch_dtype).replace("torch.", ""),
        "weight_dtypes": weight_dtypes,
        "rope_theta": config.rope_theta,
        "rope_scaling": getattr(config, "rope_scaling", None),  # not every config class has one
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "warnings": [str(w.message) for w in caught],
        "loss": loss,
    }))


if __name__ == "__main__":
    main()
