/*
 * amx_common.h — the tile configuration the AMX kernels (x86/amx_*.c) share: palette 1's
 * 64-byte LDTILECFG operand and the one way to load it.
 *
 * NOTES: the config is loaded by inline asm taking the struct as a memory operand, never
 * _tile_loadconfig(&cfg): GCC 12 drops the stores that build a struct passed to the intrinsic,
 * so every tile would be 0 x 0 and the first tileloadd would raise #UD (llama.cpp's native GCC
 * build dies with SIGILL for that reason; docs/PERFORMANCE.md "Why llama.cpp's native build dies
 * here"). Only included by files compiled with the AMX flags (kernels/CMakeLists.txt).
 */
#ifndef CLOCHER_KERNELS_X86_AMX_COMMON_H
#define CLOCHER_KERNELS_X86_AMX_COMMON_H

#include <stdint.h>
#include <string.h>

/* Palette 1 tile configuration (Intel SDM, LDTILECFG): 64 bytes. */
struct amx_tile_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
_Static_assert(sizeof(struct amx_tile_cfg) == 64, "LDTILECFG reads 64 bytes");

/* An empty palette-1 config: every tile 0 x 0 until the caller sets rows / colsb. */
static inline void amx_cfg_init(struct amx_tile_cfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
}

/* Loads cfg into the tile unit (see NOTES: a memory operand, not _tile_loadconfig). */
static inline void amx_cfg_load(const struct amx_tile_cfg *cfg)
{
    __asm__ volatile("ldtilecfg %0" ::"m"(*cfg));
}

/* Tiles 0-7 all 16 rows x 64 bytes, loaded. */
static inline void amx_cfg_load_full(void)
{
    struct amx_tile_cfg cfg;
    amx_cfg_init(&cfg);
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    amx_cfg_load(&cfg);
}

#endif
