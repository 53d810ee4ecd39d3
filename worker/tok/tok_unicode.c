/*
 * tok_unicode.c — the little Unicode the tokenizers need: strict UTF-8 (RFC 3629), the
 * letter / number / white-space classes of the GPT-2 pre-tokenizer regex, and byte-level
 * BPE's byte <-> character mapping.
 *
 * The classes come from a generated table of ranges (tok_unicode_tables.h, Unicode 14) and a
 * binary search; ASCII takes a fast path since it dominates real text.
 */
#include "tok_internal.h"

#include <stddef.h>
#include <stdint.h>

struct tok_urange {
    uint32_t lo, hi; /* inclusive */
};

#include "tok_unicode_tables.h"

size_t tok__utf8_len(const unsigned char *p, size_t n)
{
    if (n == 0)
        return 0;
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90; /* overlong */
        else if (c == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0; /* continuation byte, C0/C1 (overlong) or F5..FF */
    }
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

size_t tok__utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = tok__utf8_len(p + i, n - i);
        if (l == 0)
            return i;
        i += l;
    }
    return n;
}

uint32_t tok__utf8_decode(const unsigned char *p, size_t len)
{
    switch (len) {
    case 1: return p[0];
    case 2: return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    case 3: return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    default:
        return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
               (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
    }
}

size_t tok__utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static bool in_ranges(const struct tok_urange *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

bool tok__is_letter(uint32_t cp)
{
    if (cp < 0x80)
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(tok_letter_ranges, sizeof tok_letter_ranges / sizeof tok_letter_ranges[0],
                     cp);
}

bool tok__is_number(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    return in_ranges(tok_number_ranges, sizeof tok_number_ranges / sizeof tok_number_ranges[0],
                     cp);
}

bool tok__is_space(uint32_t cp)
{
    /* White_Space=yes (PropList.txt), which is what \s means in Unicode-aware regex engines
     * (Oniguruma under Hugging Face tokenizers); note U+001C..U+001F are not included. */
    if (cp <= 0x20)
        return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85)
        return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/*
 * GPT-2 maps every byte to a printable character so that BPE works on text: the 188 bytes
 * that are printable Latin-1 (0x21..0x7E, 0xA1..0xAC, 0xAE..0xFF) stand for themselves; the
 * other 68 (controls, space, DEL, 0x80..0xA0, soft hyphen) take U+0100.. in byte order.
 */
static bool byte_is_self(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t tok__byte_to_cp(uint8_t b)
{
    if (byte_is_self(b))
        return b;
    uint32_t k = 0; /* how many non-self bytes come before b */
    for (unsigned i = 0; i < b; i++)
        k += !byte_is_self(i);
    return 0x100 + k;
}

int tok__cp_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return byte_is_self(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68)
        return -1;
    uint32_t k = cp - 0x100;
    for (unsigned b = 0; b < 256; b++)
        if (!byte_is_self(b) && k-- == 0)
            return (int)b;
    return -1; /* unreachable: 68 bytes are not self */
}
