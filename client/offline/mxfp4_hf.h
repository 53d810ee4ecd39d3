/*
 * mxfp4_hf.h — the one conversion between Hugging Face's MXFP4 layout and GGUF's block_mxfp4
 * (= IEBIN's mxfp4), shared by the converter (HF import) and synth (its GGUF output), so the
 * two can never disagree on a nibble.
 *
 * Hugging Face (gpt-oss `*_blocks` / `*_scales`, ../shared/specs/gpt-oss.md §4.4): a block of
 * 32 elements is 16 bytes, byte i holding element 2i in its low and element 2i+1 in its high
 * nibble; its E8M0 scale lives in a separate tensor. GGUF: the scale byte first, then byte j
 * holding element j low and element j+16 high. Same codes, same scale: lossless both ways.
 */
#ifndef CLOCHER_CLIENT_MXFP4_HF_H
#define CLOCHER_CLIENT_MXFP4_HF_H

#include <stdint.h>

/* out [17] = block_mxfp4 of the HF block hf [16] with scale e. */
static inline void mxfp4_block_from_hf(const uint8_t *hf, uint8_t e, uint8_t *out)
{
    uint8_t el[32]; /* one E2M1 code per element */
    for (int i = 0; i < 16; i++) {
        el[2 * i] = hf[i] & 0x0f;
        el[2 * i + 1] = hf[i] >> 4;
    }
    out[0] = e;
    for (int j = 0; j < 16; j++)
        out[1 + j] = (uint8_t)(el[j] | (el[j + 16] << 4));
}

#endif
