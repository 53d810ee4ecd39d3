#!/usr/bin/python3
"""golden_greedy.py — issue 3's acceptance check: greedy ids of a converted stories260K model
against llama2.c's golden ones (fixtures/stories260K/golden.json), per case up to the first
step whose reference margin (top-1 minus top-2 logit) is below --tau.

Usage: golden_greedy.py IE MODEL_DIR GOLDEN_JSON [--flip-below X]
Per case, the greedy ids are compared up to the first step whose golden margin is below 0.01
(the fixtures README's rule). Prints one line per case: the steps compared and the first
disagreeing step with its golden margin (or "agree"). Exit 0 when every case agrees — or,
with --flip-below X, when every case's first disagreement is at a step whose golden margin is
below X; 1 otherwise; 2 on a usage or input problem (named).

Why --flip-below: 0.01 is the summation-order noise of an fp32 engine. Weight rounding moves
the margins by more (stories260K over 4.6k positions, measured: f16 weights |change of the
top-1 minus top-2 logit| p99 0.04, max 0.09; Q8_0 weights p99 1.1, max 2.0 — docs/
PERFORMANCE.md "Quality, session 5"), so a quantized model is held to the strict rule (the
issue's acceptance) and, as a guard, to a bound of its own dtype: a flip at a step of larger
margin than the dtype can move is a bug (a wrong block direction, a bad scale), not rounding.
Only the standard library: tests must not need numpy.
"""
import json
import subprocess
import sys


def main(argv):
    if len(argv) not in (4, 6) or (len(argv) == 6 and argv[4] != "--flip-below"):
        print("usage: golden_greedy.py IE MODEL_DIR GOLDEN_JSON [--flip-below X]",
              file=sys.stderr)
        return 2
    ie, model, golden = argv[1:4]
    tau = 0.01
    try:
        flip_below = float(argv[5]) if len(argv) == 6 else 0.0
    except ValueError:
        print(f"golden_greedy.py: --flip-below {argv[5]}: expected a number", file=sys.stderr)
        return 2
    try:
        with open(golden) as f:
            cases = json.load(f)["cases"]
    except (OSError, ValueError, KeyError) as e:
        print(f"{golden}: cannot read the golden cases ({e}); the fixtures are needed "
              "(CLOCHER_FIXTURES)", file=sys.stderr)
        return 2
    ok = True
    for i, c in enumerate(cases):
        prompt, greedy, margin = c["prompt"], c["greedy"], c["greedy_margin"]
        lim = next((g for g, m in enumerate(margin) if m < tau), len(greedy))
        if lim == 0:
            print(f"case {i}: prompt {len(prompt)}, nothing to compare (step 0 margin < {tau})")
            continue
        out = subprocess.run([ie, "--model-dir", model, "--prompt-ids",
                              ",".join(map(str, prompt)), "--max-new", str(lim), "--greedy",
                              "--ignore-eos", "--print-ids", "--quiet", "--threads", "1"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"case {i}: inference-engine failed: {out.stderr.strip()}", file=sys.stderr)
            return 2
        ids = json.loads(out.stdout.splitlines()[0])["generated_ids"]
        diff = next((g for g in range(lim) if g >= len(ids) or ids[g] != greedy[g]), None)
        if diff is None:
            print(f"case {i}: prompt {len(prompt)}, steps 0..{lim - 1} agree")
        else:
            ok = ok and margin[diff] < flip_below
            print(f"case {i}: prompt {len(prompt)}, step {diff} of {lim} differs "
                  f"(golden margin {margin[diff]:.4f}): got {ids[diff] if diff < len(ids) else None}, "
                  f"golden {greedy[diff]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
