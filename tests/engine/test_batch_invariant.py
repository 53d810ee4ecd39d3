#!/usr/bin/env python3
"""test_batch_invariant.py — batch-invariant requests (issue 16, gpt-oss acceptance 4) on every
ISA: writes random-weight models with `clocher synth` and `clocher convert` (Llama: the demo
preset in f32, bf16, int8 and int4; gpt-oss-tiny in f32 and bf16 with its MXFP4 experts) and runs
tests/engine/batch_inv on each at CLOCHER_ISA=ref, avx2 and avx512 (an ISA the CPU lacks is
reported as skipped). batch_inv checks that 8 greedy requests of mixed lengths give under load
(mid-run joins, chunked prefill) the ids and logits bits each gives alone, and that a seeded
sampled request beside 9 others gives its solo tokens. The Llama f32 model runs once more with
a LoRA adapter on all 7 projections used by every other request (mixed adapted and base rows).

Its control (the same batch without the flag) must differ on the SIMD ISAs for the float
models (the gemv/gemm orders the mode exists for): that shows the check can fail.
In a sanitized build (CLOCHER_SANITIZE set) only the f32 models run: the others take the same
code paths in matmul.c and the engine, and ten times the time. There each model also runs at one
ISA, the ISAs taken in turn (llama f32 at avx512, with LoRA at avx2, gpt-oss-tiny at ref; the
next one when the CPU lacks it): every model and every ISA still runs sanitized, and the engine
code the sanitizers watch is the same at each ISA (the kernels are checked sanitized against
their references in tests/kern). The whole grid, every model at every ISA, runs in release.
"""
import os
import subprocess
import sys
import tempfile

BUILD = os.environ["CLOCHER_BUILD_DIR"]
SANITIZED = bool(os.environ.get("CLOCHER_SANITIZE"))
CLOCHER = os.path.join(BUILD, "client", "clocher")
DRIVER = os.path.join(BUILD, "tests", "engine", "batch_inv")

failed = 0


def check(what, ok, detail=""):
    global failed
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failed += 1


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")


def main():
    with tempfile.TemporaryDirectory(prefix="batchinv-") as tmp:
        models = []
        llama = os.path.join(tmp, "demo-hf")
        run([CLOCHER, "synth", "--preset", "demo", llama])
        for dt in ("f32",) if SANITIZED else ("f32", "bf16", "int8", "int4"):
            out = os.path.join(tmp, f"demo-{dt}.ie")
            run([CLOCHER, "convert", llama, out, "--dtype", dt])
            models.append((f"llama {dt}", [out], dt in ("f32", "bf16")))
            if dt == "f32":
                ad = os.path.join(tmp, "adapter")
                run([CLOCHER, "synth-adapter", out, ad, "--rank", "8", "--seed", "3",
                     "--targets", "q,k,v,o,gate,up,down", "--strength", "0.5"])
                models.append(("llama f32 + LoRA", [out, ad], True))
        oss = os.path.join(tmp, "oss-hf")
        run([CLOCHER, "synth", "--preset", "gpt-oss-tiny", oss, "--vocab", "1024"])
        for dt in ("f32",) if SANITIZED else ("f32", "bf16"):
            out = os.path.join(tmp, f"oss-{dt}.ie")
            run([CLOCHER, "convert", oss, out, "--dtype", dt])
            models.append((f"gpt-oss-tiny {dt}", [out], True))
        isas = ("ref", "avx2", "avx512")
        if SANITIZED:
            # (model, the ISAs it tries in order: the first the CPU has runs)
            grid = [(m, isas[(2 - i) % 3:] + isas[:(2 - i) % 3]) for i, m in enumerate(models)]
        else:
            grid = [(m, (isa,)) for isa in isas for m in models]
        for (name, args, float_model), tries in grid:
            for isa in tries:
                r = subprocess.run([DRIVER] + args, capture_output=True, text=True,
                                   env=dict(os.environ, CLOCHER_ISA=isa))
                if r.returncode == 77:
                    print(f"skip {name} on {isa}: {r.stdout.strip()}")
                    continue
                if SANITIZED:
                    print(f"sanitized build: {name} at {isa} only (every ISA in release)")
                bad = [l for l in r.stdout.splitlines() if l.startswith("FAIL")]
                check(f"{name} on {isa}: batched = alone", r.returncode == 0,
                      f"exit {r.returncode}; " + "; ".join(bad[:3]) + r.stderr[-300:]
                      if r.returncode else r.stdout.strip().splitlines()[-1])
                ctl = [l for l in r.stdout.splitlines() if l.startswith("control:")]
                if isa != "ref" and float_model and ctl:
                    differ = int(ctl[0].split()[1])
                    check(f"{name} on {isa}: the control differs without the flag", differ > 0,
                          ctl[0])
                break
    print(f"{'FAILED' if failed else 'passed'}: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
