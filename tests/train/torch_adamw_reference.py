#!/usr/bin/python3
"""Reference for tests/train/adamw_test.cpp: torch.optim.AdamW, or with --optimizer adam
torch.optim.Adam (L2 weight decay), (+ clip_grad_norm_) in fp32.

Initial parameters and every step's gradients come from an integer hash that the C++ test
computes identically (values are multiples of 1/2048 in [-1, 1), exact in fp32), so no
tensors have to be passed in. Prints, one item per line, with repr() of the fp32 values
(exact when parsed back as double and rounded to float):
  norm <step> <pre-clip total norm>           (only with --max-norm > 0)
  param|exp_avg|exp_avg_sq <tensor> <v0> <v1> ...
Exit status 2 with a message on stderr if torch (or numpy) cannot be imported.
"""
import argparse
import sys

try:
    import numpy as np
    import torch
except Exception as e:  # noqa: BLE001 - any import failure is the same failure here
    print(f"torch_adamw_reference.py: cannot import torch with {sys.executable}: {e}",
          file=sys.stderr)
    sys.exit(2)

MASK32 = np.uint64(0xFFFFFFFF)


def hashed_values(tensor, n, salt):
    # Must match hashed_value() in adamw_test.cpp. uint64 arithmetic wraps mod 2^64, and
    # masking to 32 bits afterwards gives the same as arithmetic mod 2^32.
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(tensor * 40503 + salt * 97 + 12345)) & MASK32
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) & MASK32
    h ^= h >> np.uint64(13)
    return (((h >> np.uint64(8)) % np.uint64(4096)).astype(np.float64) - 2048.0) / 2048.0


def hashed_tensor(tensor, n, salt, scale):
    # Values are multiples of 1/2048 and scale is a power of two: exact in fp32.
    return torch.from_numpy(hashed_values(tensor, n, salt) * scale).to(torch.float32)


def floats(text):
    return [float(x) for x in text.split(",")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True, help="comma-separated tensor sizes")
    ap.add_argument("--lrs", required=True, help="learning rate of each step")
    ap.add_argument("--grad-scales", required=True, help="gradient scale of each step")
    ap.add_argument("--betas", required=True)
    ap.add_argument("--eps", type=float, required=True)
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--max-norm", type=float, default=0.0, help="0: no clipping")
    ap.add_argument("--optimizer", choices=["adamw", "adam"], default="adamw")
    args = ap.parse_args()

    torch.set_num_threads(1)
    sizes = [int(x) for x in args.sizes.split(",")]
    lrs = floats(args.lrs)
    grad_scales = floats(args.grad_scales)
    assert len(lrs) == len(grad_scales)
    beta1, beta2 = floats(args.betas)

    params = [torch.nn.Parameter(hashed_tensor(t, n, 0, 1.0)) for t, n in enumerate(sizes)]
    cls = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    opt = cls(params, lr=lrs[0], betas=(beta1, beta2), eps=args.eps, weight_decay=args.weight_decay)
    out = []
    for step, (lr, scale) in enumerate(zip(lrs, grad_scales)):
        for t, p in enumerate(params):
            p.grad = hashed_tensor(t, p.numel(), step + 1, scale)
        if args.max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, args.max_norm)
            out.append(f"norm {step} {float(norm)!r}")
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    for t, p in enumerate(params):
        state = opt.state[p]
        for name, value in (("param", p.detach()), ("exp_avg", state["exp_avg"]),
                            ("exp_avg_sq", state["exp_avg_sq"])):
            out.append(f"{name} {t} " + " ".join(repr(x) for x in value.tolist()))
    print("\n".join(out))


if __name__ == "__main__":
    main()
