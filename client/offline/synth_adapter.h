/*
 * synth_adapter.h — deterministic random LoRA adapters in PEFT form for an IEBIN base model
 * (`clocher synth-adapter`; tests and benchmarks of the LoRA path).
 *
 * The adapter is what PEFT would save: adapter_config.json + adapter_model.safetensors with
 * base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A,B}.weight, lora_B's q/k
 * rows in Hugging Face's rotate-half order (lora.c reorders them on load, as for a real
 * adapter). Unlike PEFT's initialisation, lora_B is not zero: the adapter changes outputs.
 *
 * Magnitudes: A ~ U with std 1/sqrt(in), so A x keeps the scale of x; B with std
 * strength * rms(W) * sqrt(in) / (s * sqrt(r)) where W is the base projection of the same
 * layer and s the LoRA scaling, so each adapted projection's output moves by about
 * `strength` (default 0.05) times the base output's size: a clearly visible but bounded
 * change (on stories260K, an all-projection adapter moves logits by ~1 on average and changes
 * the top-1 token at ~40% of positions; a single projection at 10-30%). Every tensor has its
 * own PRNG stream derived from (seed, layer, module, A/B), so a
 * projection's weights do not depend on which other targets are chosen.
 */
#ifndef CLOCHER_CLIENT_SYNTH_ADAPTER_H
#define CLOCHER_CLIENT_SYNTH_ADAPTER_H

#include "dtype.h"
#include "iebin.h"

#include <stdint.h>

#define SYNTH_ADAPTER_STRENGTH 0.05f

struct synth_adapter_opts {
    uint32_t rank;        /* 1..LORA_MAX_RANK */
    float alpha;          /* lora_alpha; finite and non-zero */
    uint32_t target_mask; /* bits (1 << enum lora_target), non-zero */
    uint64_t seed;
    enum dtype dtype;     /* tensor dtype written: DT_F32, DT_F16 or DT_BF16 */
    float strength;       /* relative change of each adapted projection; 0 = default */
};

/*
 * Writes the adapter for `base` into out_dir (created with missing parents). The weights go
 * first, then adapter_config.json (atomically, any previous one removed before anything is
 * written), so an interrupted run leaves no configuration that loads. Same options and base
 * -> byte-identical files. 0, or a negative code logged once (ERR_USAGE for bad options).
 */
int synth_adapter_write(const struct iebin_model *base, const char *out_dir,
                        const struct synth_adapter_opts *o);

#endif
