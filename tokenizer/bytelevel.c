/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other bytes
 * map in order to U+0100.. so that every byte has a visible, non-space character. */
#include "tokenizer/tok_internal.h"

static int printable(int b) { return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff); }

uint32_t tllm_bytelevel_char(uint8_t b) {
    if (printable(b)) return b;
    uint32_t n = 0; /* rank of b among the non-printable bytes */
    for (int i = 0; i < b; i++) n += !printable(i);
    return 256 + n;
}

int tllm_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable((int)cp) ? (int)cp : -1;
    uint32_t n = cp - 256;
    for (int b = 0; b < 256; b++)
        if (!printable(b) && n-- == 0) return b;
    return -1;
}
