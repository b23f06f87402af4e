/*
 * utf8.c — UTF-8 validation for the tokenizer.
 *
 * The detokenizer must know, byte by byte, whether what it holds is a
 * complete character, the start of one, or garbage; NFC must skip invalid
 * bytes. Both follow the Unicode "maximal subpart" rule (the one WHATWG's
 * decoder uses): the well-formed prefix of a broken sequence counts as one
 * error, so "\xE2\x82" followed by "A" is one U+FFFD and then "A".
 */
#include "tokenizer/tokenizer_internal.h"

/* Sequence length by lead byte, 0 for bytes that cannot start one. */
static int lead_length(uint8_t b) {
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0; /* continuation bytes and overlong C0, C1 */
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    if (b < 0xF5) return 4;
    return 0;
}

/* The allowed range of the second byte: narrower after E0, ED, F0 and F4,
 * which would otherwise allow overlong forms, surrogates or code points
 * above U+10FFFF. */
static void second_range(uint8_t lead, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (lead == 0xE0)
        *lo = 0xA0;
    else if (lead == 0xED)
        *hi = 0x9F;
    else if (lead == 0xF0)
        *lo = 0x90;
    else if (lead == 0xF4)
        *hi = 0x8F;
}

int utf8_sequence(const uint8_t *s, size_t n) {
    int len = lead_length(s[0]);
    if (len == 0) return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (i == 1) second_range(s[0], &lo, &hi);
        if (s[i] < lo || s[i] > hi) return -i;
    }
    return len;
}

size_t utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
