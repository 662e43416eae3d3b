/* Stochastic rounding of one fp32 chunk, drawing from a torch CPU generator's Mersenne Twister.
 *
 * The same bits as the torch calls of `optimum_ipu/runtime/rounding.py` (`_Noise.round_`): one 32-bit
 * word per two elements, in order, from MT19937 as torch's CPU generator runs it; element 2k takes the
 * word's low 13 bits as noise, element 2k + 1 the 13 bits from bit 16 (torch's int32 `random_()` keeps
 * the word modulo 2^31, which touches neither field). Each element's fp32 bit pattern gets its noise
 * added (modulo 2^32, as torch's int32 add) and its 13 low bits cut; an odd chunk's last word feeds one
 * element. The generator's state comes in and goes out as the bytes of torch's `Generator.get_state()`.
 *
 * `rounding_kernel.py` compiles this file on first use and `rounding.py` checks it against torch's own
 * draws before using it; if torch ever lays its state out otherwise, the size check below refuses it,
 * that check fails and torch's calls stay.
 */
#include <stdint.h>
#include <string.h>

/* MT19937 */
#define STATE_N 624
#define STATE_M 397

/* torch's CPU generator state (CPUGeneratorImplState, with its legacy THGeneratorState first):
 * uint64 seed @0, int32 left @8, int32 seeded @12, uint64 next @16, uint64 state[624] @24, ... */
#define STATE_BYTES 5056
#define LEFT_AT 8
#define NEXT_AT 16
#define WORDS_AT 24

#define DROPPED 0x1fffu                  /* fp32 keeps 23 mantissa bits, fp16 10: 13 are dropped */
#define LOW31 0x7fffffff7fffffffull      /* two elements at once: all but their sign bits */
#define SIGNS 0x8000000080000000ull
#define KEPT 0xffffe000ffffe000ull

static uint32_t twist(uint32_t u, uint32_t v) {
    return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

static void next_state(uint32_t *s) {
    int i = 0;
    for (; i < STATE_N - STATE_M; i++) s[i] = s[i + STATE_M] ^ twist(s[i], s[i + 1]);
    for (; i < STATE_N - 1; i++) s[i] = s[i + STATE_M - STATE_N] ^ twist(s[i], s[i + 1]);
    s[STATE_N - 1] = s[STATE_M - 1] ^ twist(s[STATE_N - 1], s[0]);
}

static inline uint32_t temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* Round the `n` fp32 values at `bits` (as their bit patterns) in place. Returns 0, or a negative number
 * when `state` is not a CPU generator state this file knows (then nothing has changed). */
int optimum_ipu_round_chunk(uint32_t *bits, int64_t n, unsigned char *state, int64_t state_bytes) {
    uint32_t s[STATE_N];
    uint64_t wide[STATE_N];
    int32_t left;
    uint64_t next;
    if (state_bytes != STATE_BYTES) return -1;
    memcpy(&left, state + LEFT_AT, sizeof left);
    memcpy(&next, state + NEXT_AT, sizeof next);
    /* left - 1 words are read from state[next] on: never past the end (torch's own engine does not check) */
    if (left < 1 || left > STATE_N || next > STATE_N || next + (uint64_t)left > STATE_N + 1) return -2;
    memcpy(wide, state + WORDS_AT, sizeof wide);
    for (int i = 0; i < STATE_N; i++) s[i] = (uint32_t)wide[i];

    /* torch draws a word as: if (--left == 0) twist (left = 624, next = 0); then state[next++]. So
     * left - 1 words are ready before the next twist, and after one the first word leaves left at 624. */
    int64_t pairs = n / 2, words = (n + 1) / 2, done = 0;
    while (done < words) {
        int64_t ready = (int64_t)left - 1;
        if (ready <= 0) {
            next_state(s);
            left = STATE_N + 1;
            next = 0;
            ready = STATE_N;
        }
        int64_t take = words - done < ready ? words - done : ready;
        int64_t whole = done + take > pairs ? pairs - done : take;
        const uint32_t *drawn = s + next;
        uint64_t two[1];
        for (int64_t j = 0; j < whole; j++) {
            uint64_t y = temper(drawn[j]);
            uint64_t noise = (y & DROPPED) | (((y >> 16) & DROPPED) << 32);
            memcpy(two, bits + 2 * (done + j), sizeof two);
            /* two 32-bit adds side by side: no carry crosses from one element into the other */
            two[0] = ((((two[0] & LOW31) + noise) ^ (two[0] & SIGNS))) & KEPT;
            memcpy(bits + 2 * (done + j), two, sizeof two);
        }
        if (whole < take) { /* an odd chunk's last element */
            uint32_t *last = bits + 2 * (done + whole);
            *last = (*last + (temper(drawn[whole]) & DROPPED)) & ~DROPPED;
        }
        next += (uint64_t)take;
        left -= (int32_t)take;
        done += take;
    }

    for (int i = 0; i < STATE_N; i++) wide[i] = s[i];
    memcpy(state + LEFT_AT, &left, sizeof left);
    memcpy(state + NEXT_AT, &next, sizeof next);
    memcpy(state + WORDS_AT, wide, sizeof wide);
    return 0;
}
